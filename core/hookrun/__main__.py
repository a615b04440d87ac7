"""``python -m hookrun`` runs the CLI (torchrun uses this form)."""

from hookrun.cli.commands import main

main()
