"""Process start-up, below the HTTP room and before the serving room: `start.py` (what
`api/cli.py` calls once the flags are parsed), `preload.py` (the model read while the server
imports), `hf_download.py` (`-hf`). Importing this package imports neither torch nor the engine.
"""
