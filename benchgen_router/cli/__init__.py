"""The command line: `benchgen-router <command>`, one module per subcommand (thin: argument parsing
and output; the work is done by the library modules)."""
