# flexigpt-bench: every method x ratio, the ablations and the extension, evaluated and tabulated.
#   snakemake --cores all                                   (embedded default, config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml    (tiny CI run)
#   snakemake --cores all --configfile config/paper.yaml --workflow-profile workflow/profiles/slurm
import os

from snakemake.utils import min_version

min_version("9.0")

# Jobs import the harness from this checkout: under --use-conda their environment holds only
# its dependencies (workflow/envs/flexigpt.yaml); the venv route also has it installed editable.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (workflow.basedir, os.environ.get("PYTHONPATH")) if p)


# The embedded default only when no --configfile is given: a user's config is validated as
# written, never silently completed from the default's keys.
if not config:

    configfile: "config/config.yaml"



include: "workflow/rules/common.smk"
include: "workflow/rules/resources.smk"
include: "workflow/rules/compress.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        TABLES_DIR,
