"""Command-line interface: `main.py` parses and dispatches; one module per subcommand."""
