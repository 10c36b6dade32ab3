"""The assembly: the settings (`options.py`, `config.py`), the object graph (`build.py`) and the
scheduled jobs of the running process (`runtime.py`)."""
