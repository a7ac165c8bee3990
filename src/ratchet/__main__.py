"""``python -m ratchet``: the same command line as the ``ratchet`` script, for an environment whose scripts folder is
not on ``PATH`` (a venv not activated, ``pip install --user``)."""

from ratchet.cli import main

main()
