"""dockflow's composition root: the CLI, process wiring, and the generated camera contract."""

__version__ = "0.1.0"
