"""Layer 1, core: facts and I/O that know no model.

The device setting (``devices``), kill points (``faults``), parameter counting (``params``),
dtypes (``precision``), freed heap memory (``memory``), provenance, LR schedules
(``schedule``), the bracketing learning-rate search (``lr_search``), bootstrap intervals and
verdict rules (``stats``), the static import graph
(``code_deps``, ``import_contract``), writability checks (``preflight``), atomic outputs and
path/hash checks (``fileio``). Imports nothing from the layers above (``docs/ARCHITECTURE.md``).
"""
