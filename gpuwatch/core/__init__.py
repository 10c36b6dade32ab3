"""Plain data and the pieces every layer uses: samples, label sets, matchers and series (`model.py`),
the `GpuwatchError` tree (`errors.py`), RE2 regexes as Prometheus and Alertmanager anchor them
(`regex.py`), the only clock (`clock.py`), durations and times as users write them (`units.py`), the
scheduled-job wrapper (`jobs.py`) and the credentials file (`credentials.py`). The core imports nothing
else of gpuwatch."""
