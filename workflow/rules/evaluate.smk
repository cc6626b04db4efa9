# Perplexity + zero-shot tasks (stage final), or perplexity only (stage start), and the
# inference-cost measurement of Tables 6/7 (all models timed in one process).


rule evaluate:
    input:
        unpack(eval_inputs),
    output:
        "results/{model}/{method}/{variant}/{setting}/eval_{stage}.json",
    params:
        evaluation=eval_params,
        code=code_of("evaluate"),
    log:
        "logs/{model}/{method}/{variant}/{setting}/eval_{stage}.log",
    benchmark:
        "logs/timings/{model}/{method}/{variant}/{setting}/eval_{stage}.tsv"
    priority: PRIORITY.of("evaluate")
    threads: JOB_THREADS
    resources:
        mem_mb=8000,
        gpu=JOB_GPU,
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/evaluate.py"


rule inference_cost:
    input:
        unpack(inference_inputs),
    output:
        "results/{model}/inference.json",
    params:
        inference=GRID.inference,
        code=code_of("inference"),
    log:
        "logs/{model}/inference.log",
    # every local core (capped): no other job shares the CPU while latencies are timed
    priority: PRIORITY.of("inference_cost")
    threads: local_cores(16)
    resources:
        gpu=JOB_GPU,
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/inference.py"
