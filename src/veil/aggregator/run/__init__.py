"""Running an aggregator: its configuration (`config.py`), opening its
storage (`backend.py`), gRPC options and the channel to the helper
(`channels.py`), the server (`server.py`), the signals it takes
(`signals.py`) and the leader's driver with `veil worker` (`worker.py`)."""
