"""``python -m opendws.cli``: the ``dws`` command."""

from opendws.cli import main

main()
