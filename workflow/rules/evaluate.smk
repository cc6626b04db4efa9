# Perplexity + zero-shot tasks (stage final), or perplexity only (stage start), and the
# inference-cost measurement of Tables 6/7 (all models timed in one process).


rule evaluate:
    input:
        unpack(eval_inputs),
    output:
        "results/{model}/{method}/{variant}/{setting}/eval_{stage}.json",
    params:
        evaluation=eval_params,
        code=CODE_VERSION,
    log:
        "logs/{model}/{method}/{variant}/{setting}/eval_{stage}.log",
    benchmark:
        "benchmarks/{model}/{method}/{variant}/{setting}/eval_{stage}.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=1,
    conda:
        "../../environment.yml"
    script:
        "../scripts/evaluate.py"


rule inference_cost:
    input:
        unpack(inference_inputs),
    output:
        "results/{model}/inference.json",
    params:
        inference=GRID.inference,
        code=CODE_VERSION,
    log:
        "logs/{model}/inference.log",
    threads: 2
    resources:
        gpu=1,
    conda:
        "../../environment.yml"
    script:
        "../scripts/inference.py"
