# Tables (Markdown, CSV, LaTeX) and plots from the result files, next to the paper's numbers.


rule tables:
    input:
        evals=GRID.eval_targets(),
        inference=GRID.inference_targets(),
        figure_dirs=figure_dirs(),  # deleted trained/compressed dirs are rebuilt, not missed
    output:
        report(
            directory("results/tables"),
            patterns=["{name}.png"],
            caption="../report/tables.rst",
            category="Tables and figures",
        ),
    params:
        figures=GRID.figure_inputs(),
        code=CODE_VERSION,
        # model key -> display name for table titles (config model.name, default: the key)
        model_names={config["model"]["key"]: config["model"].get("name", config["model"]["key"])},
    log:
        "logs/tables.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/tables.py"
