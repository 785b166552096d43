"""Shared by every tier. Being here, above tests/unit, tests/ops, tests/resolver and the others
(none of them a package), this file has pytest put tests/ on sys.path (its default "prepend"
import mode), so that each tier imports tests/helpers.py as ``helpers``, run alone or together."""
