"""Layer 8, workflow: the run grid behind the Snakefile.

One builder per config section (``dag``), the checks made before any job starts
(``config_check``, ``config_schema``, ``config_paths``, ``resource_check``,
``model_skeletons``), and the helpers every ``workflow/scripts/*.py`` imports (``support``).
"""
