"""``python -m hookrun`` runs the CLI (torchrun uses this form)."""

from hookrun.cli import main

main()
