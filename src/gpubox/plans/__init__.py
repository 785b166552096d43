"""Layer 5, plans: what a stage does, from a host's configuration; no I/O, no pyinfra.

Pure plans: what a stage does, computed from a host's configuration (and the facts it is
given), no I/O and nothing of pyinfra. The stages follow them; the checks, bench and doctor
import them at the top to judge a box by the plan the stage followed."""
