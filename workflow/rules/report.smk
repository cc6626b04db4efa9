# Tables (Markdown, CSV, LaTeX) and plots from the result files, next to the paper's numbers,
# in results/<model.key>/tables: every config writes its own (a smoke run never mixes into
# the default's tables or report).


rule tables:
    input:
        evals=GRID.eval_targets(),
        inference=GRID.inference_targets(),
        figure_dirs=figure_dirs(),  # deleted trained/compressed dirs are rebuilt, not missed
    output:
        report(
            directory(TABLES_DIR),
            patterns=["{name}.png", "{name}.html"],  # figures + report.html (every table)
            caption="../report/tables.rst",
            category="Tables and figures",
        ),
    params:
        figures=GRID.figure_inputs(),
        code=code_of("tables"),
        # model key -> display name for table titles (config model.name, default: the key)
        model_names={config["model"]["key"]: config["model"].get("name", config["model"]["key"])},
    log:
        f"logs/{config['model']['key']}/tables.log",
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/tables.py"
