# Config validation, the run grid and input functions. Everything below is a pure function of
# the (validated) config; heavy logic lives in the flexigpt package.
import sys
from pathlib import Path

from snakemake.utils import validate

from flexigpt.core.code_deps import rule_code_version
from flexigpt.workflow.config_check import ConfigError, check_ratios, raise_problems
from flexigpt.workflow.config_schema import check_schema
from flexigpt.workflow.dag import RunGrid
from flexigpt.workflow.resource_check import check_resources
from flexigpt.core.schedule import Priorities
from flexigpt.workflow.support import PROMPT_TEXT, checkout_on_pythonpath

# jobs import the harness from this checkout (under --use-conda their environment holds only
# its dependencies: workflow/envs/flexigpt.yaml)
checkout_on_pythonpath(workflow.basedir)
try:
    # one line naming the file and the key (Snakemake's validate would print the schema)
    check_schema(config, workflow.config_settings.configfiles)
    validate(config, schema="../schemas/config.schema.yaml")  # also fills the defaults
    # ratios that would merge into one run directory, or name one the DAG cannot match
    raise_problems(((item, "") for item in check_ratios(config)))
    # builds every run's method config and TrainConfigs, checks sizes, ratio reach and
    # model paths: a bad option is a short error here, before any job (flexigpt.workflow.config_check)
    GRID = RunGrid.from_config(config)
except ConfigError as err:  # its lines alone: no engine stack frames around them
    print(f"flexigpt: {err}", file=sys.stderr)
    sys.exit(1)
if workflow.is_main_process:  # the resources already built are what their builds recorded
    check_resources(config, GRID)

def code_of(script):
    """Hash of the harness code a rule's script can run (flexigpt.core.code_deps): a rule's jobs
    rerun when that code changes, and only then (editing a plot reruns only the tables)."""
    return rule_code_version(Path(workflow.basedir) / "workflow" / "scripts" / f"{script}.py")

JOB_THREADS = config["jobs"]["threads"]  # torch threads of each heavy job


def local_cores(cap=16):
    """Every core of a local run (at most ``cap``), for a job timed alone; ``cap`` on a
    cluster executor, where no total number of cores is defined."""
    from snakemake.exceptions import WorkflowError

    try:
        return min(workflow.cores, cap)
    except WorkflowError:
        return cap

JOB_GPU = config["jobs"]["gpu"]  # `gpu` resource units each heavy job holds
# processes of a train job (None: one per GPU the job holds, when it holds several)
TRAIN_PROCESSES = config["jobs"].get("train_processes")
TABLES_DIR = f"results/{config['model']['key']}/tables"  # this config's tables and figures


wildcard_constraints:
    model="|".join(GRID.model_keys),
    method="[a-z_]+",
    variant="[a-z0-9_]+",
    setting=r"r0\.[0-9]+|full|L[0-9]+",
    stage="start|final",


def model_input(wildcards):
    """The base model as a file input when it is local (hub ids are passed as params)."""
    return GRID.local_model_inputs(wildcards.model)


def run_of(wildcards):
    return GRID.run(wildcards.model, wildcards.method, wildcards.variant, wildcards.setting)


def compress_inputs(wildcards):
    run = run_of(wildcards)
    inputs = dict(GRID.local_model_inputs(wildcards.model))
    if run.needs_calibration:
        inputs["text"] = GRID.calibration_text
    if run.uses_block_influence:
        inputs["bi"] = f"results/{wildcards.model}/block_influence.json"
    if run.match is not None:  # like-for-like: the achieved ratio of the model it is matched to
        inputs["match"] = GRID.runs[run.match].compressed_dir
    return inputs


def compress_params(wildcards):
    return run_of(wildcards).compress_params()


def final_model_dir(wildcards):
    return run_of(wildcards).final_dir()


def eval_model_dir(wildcards):
    run = run_of(wildcards)
    return run.compressed_dir if wildcards.stage == "start" else run.final_dir()


def eval_inputs(wildcards):
    inputs = {"model": eval_model_dir(wildcards), "ppl_text": GRID.test_text}
    if wildcards.stage == "final" and GRID.task_source == "local":
        inputs["tasks"] = GRID.tasks_dir
    return inputs


def eval_params(wildcards):
    return GRID.eval_params(run_of(wildcards), wildcards.stage)


def train_inputs(wildcards):
    """Recovery trains the run's compressed model; the budget, learning rates and
    teacher of a like-for-like run come from the runs it names."""
    run = run_of(wildcards)
    inputs = {"model": run.compressed_dir, "text": GRID.train_text, "tune": GRID.tune_text}
    if run.budget is not None:
        inputs["budget"] = GRID.runs[run.budget].compressed_dir
    if run.lr_from is not None:
        inputs["lr_from"] = GRID.runs[run.lr_from].trained_dir
    if run.loss == "kd":  # the dense teacher, as a file input when it is local
        inputs.update({"teacher": path for path in
                       GRID.local_model_inputs(wildcards.model).values()})
    return inputs


def train_trials(wildcards):
    """TrainConfig fields and grid point of every trial of the run's tuning grid."""
    run = run_of(wildcards)
    return [{"config": GRID.train_params(run, t), "point": point}
            for t, point in zip(GRID.trial_ids(run), GRID.trials(run))]


def trial_teacher(wildcards):
    run = run_of(wildcards)
    return GRID.model_path(wildcards.model) if run.loss == "kd" else None


def select_meta(wildcards):
    run = run_of(wildcards)
    return {"run": run.name, "tune_text": GRID.tune_text,
            "tune_windows": GRID.train_params(run).get("eval_windows"),
            "grid": GRID.trials(run),
            # why it trains at another run's learning rates (absent: it searches its own)
            **({"lr_reuse": GRID.reuse_reason(run)} if GRID.reuse_reason(run) else {})}


def inference_inputs(wildcards):
    """The timed models (name -> final dir) and the held-out text the decode prompts come from."""
    models = {name: run.final_dir() for name, run in GRID.inference_runs(wildcards.model).items()}
    return {**models, PROMPT_TEXT: GRID.test_text}


def figure_dirs():
    """The directory outputs holding the files the figures read (``params.figures``), as real
    inputs of the tables rule: a deleted ``trained/`` or ``compressed/`` is rebuilt."""
    files = GRID.figure_inputs()
    return sorted({str(Path(path).parent) for group in files.values() for path in group})


# Critical-path priorities (flexigpt.core.schedule): among ready jobs, the one with the longest
# estimated chain of dependents to the tables starts first, read from these output patterns
# and input functions (the rules' own).
PRIORITY = Priorities(
    {"block_influence": ("results/{model}/block_influence.json", model_input),
     "compress": ("results/{model}/{method}/{variant}/{setting}/compressed", compress_inputs),
     "train": ("results/{model}/{method}/{variant}/{setting}/trained", train_inputs),
     "evaluate": ("results/{model}/{method}/{variant}/{setting}/eval_{stage}.json",
                  eval_inputs),
     "inference_cost": ("results/{model}/inference.json", inference_inputs),
     "tables": (TABLES_DIR, lambda wildcards: [GRID.eval_targets(), GRID.inference_targets(),
                                               figure_dirs()])},
    targets=[TABLES_DIR],
    # a train job costs in proportion to its tokens and sweep (a budget ladder's 1M run first)
    scale=lambda rule, wc: (GRID.train_cost_factor(GRID.run(wc["model"], wc["method"],
                                                            wc["variant"], wc["setting"]))
                            if rule == "train" else 1.0))
