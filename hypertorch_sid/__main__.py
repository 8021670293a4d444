"""``python -m hypertorch_sid``: the main job (see :mod:`hypertorch_sid.cli`)."""

from .cli import main

if __name__ == "__main__":
    main()
