"""The benchmark suite (``benchmarks/README.md``). A package so that the tests import its pure
functions as ``benchmarks.<script>`` (pytest puts the repository root on ``sys.path``,
``pyproject.toml``); each script still runs as ``python benchmarks/<script>.py``."""
