"""Layer 8, preflight: what a stage asks of a host before it changes anything.

- ``gate``: the host preflight every stage runs first (``gate.run``: refuse, or go on);
- ``dpkg_ready``: the wait for dpkg's locks and an interrupted dpkg's recovery;
- ``answers``: the repositories' answers a run uses, kept on the box;
- ``driver_replacement``: what installing the pinned driver removes, warned before.
"""
