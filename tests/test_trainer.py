"""The trainer end to end on this machine's CPU: simulated traffic through a real collector, `tracemill mine`, a tiny
model built here, a few GRPO steps on the mined rows, a Ctrl-C that keeps a checkpoint, a resume, the registered
model, and the model reviser in `tracemill eval`.

One module, module-scoped fixtures: TRL is imported once, the model is built and trained once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from tracemill.cli import main
from tracemill.store.engine import make_engine
from tracemill.store.tables import DatasetRow
from tracemill.trainer.fault_rows import fault_cases
from tracemill.trainer.tiny import COMPACT

pytest.importorskip("trl", reason="the trainer needs the train extra")


def test_tiny_model_is_a_small_qwen3_with_a_tokenizer_for_tool_calls(tiny):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny)
    assert config.model_type == "qwen3" and config.num_hidden_layers == 2
    assert sum(f.stat().st_size for f in tiny.iterdir()) < 5e6
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    text = '<|python_start|>[get_weather(city="Zürich", days=3)]<|python_end|>'
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte level: any text, nothing unknown
    prompt = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"
    from tracemill.trainer.fault_rows import prompt_row

    lengths = sorted(len(tokenizer.apply_chat_template(prompt_row(c, COMPACT)["prompt"], tokenize=True,
                                                       return_dict=True)["input_ids"])
                     for c in fault_cases(7, sources=("bfcl",), max_calls=1)[:200])
    assert lengths[len(lengths) // 2] < 100  # a compact prompt is a few dozen tokens, not hundreds


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    """`tracemill mine` of the traffic `tracemill simulate` sent through a real collector."""
    from tracemill.simulate import simulate

    from support import CollectorProcess

    folder = tmp_path_factory.mktemp("mined")
    db = f"sqlite:///{folder / 'traffic.db'}"
    collector = CollectorProcess(db, folder).start()
    try:
        simulate(collector.url, traces=80, seed=3, profile="llama3.1-8b", start_ns=1_780_000_000_000_000_000)
    finally:
        collector.stop()
    done = CliRunner().invoke(main, ["mine", "--db", db, "--out", str(folder / "mined"), "--eval-share", "0.2",
                                     "--max-tools", "1", "--budget-tokens", "48", "--json"])
    assert done.exit_code == 0, done.output
    card = json.loads(done.output)
    assert card["splits"]["train"]["rows"] >= 16 and card["splits"]["eval"]["rows"] > 0, card["splits"]
    return folder / "mined"


CONFIG = """
device = "cpu"
[model]
base = "{base}"
kind = "full"
[data]
dataset = "{data}"
[warmup]
steps = 40
learning_rate = 3e-3
[grpo]
num_generations = 4
per_device_batch_size = 8
max_completion_length = 40
max_steps = {steps}
learning_rate = 1e-3
[output]
dir = "run"
save_steps = 1
database_url = "{db}"
[eval]
suites = ["do-no-harm"]
limit = 12
"""


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny, mined):
    """Ctrl-C a real `tracemill train` process after its first GRPO step, then resume it to the end."""
    folder = tmp_path_factory.mktemp("train")
    db = f"sqlite:///{mined.parent / 'traffic.db'}"  # the store the rows were mined from
    config = folder / "train.toml"
    config.write_text(CONFIG.format(base=tiny, data=mined, steps=200, db=db))
    run = folder / "run"
    process = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "train", "--config", str(config)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 240
    while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().strip()):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    checkpoints = sorted((run / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    listed = CliRunner().invoke(main, ["models", "list", "--db", db, "--json"]).output
    interrupted = {"rc": process.returncode, "output": output, "checkpoints": [p.name for p in checkpoints],
                   "model_saved": (run / "model").exists(), "registered": json.loads(listed),
                   "rows_files": sorted(p.name for p in run.glob("*train-rows-*"))}
    stopped_at = int(checkpoints[-1].name.split("-")[1])
    refused = CliRunner().invoke(main, ["train", "--config", str(config)])
    config.write_text(CONFIG.format(base=tiny, data=mined, steps=stopped_at + 2, db=db))
    resumed = CliRunner().invoke(main, ["train", "--config", str(config), "--resume"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    return {"folder": folder, "run": run, "db": db, "mined": mined, "interrupted": interrupted,
            "stopped_at": stopped_at, "refused": refused, "resumed": resumed}


def test_ctrl_c_keeps_a_checkpoint_and_resume_goes_on_from_it(trained):
    interrupted = trained["interrupted"]
    assert interrupted["rc"] == 130, interrupted["output"]
    assert "interrupted: saving a checkpoint after this step" in interrupted["output"]
    assert "run again with --resume" in interrupted["output"]
    assert interrupted["checkpoints"] and not interrupted["model_saved"] and interrupted["registered"] == []
    # the train split as GRPO read it (Arrow, memory-mapped), kept for --resume and removed once the run is done
    assert len(interrupted["rows_files"]) == 1 and interrupted["rows_files"][0].endswith("-all.arrow")
    assert not list(trained["run"].glob("*train-rows-*"))
    refused = trained["refused"]
    assert refused.exit_code == 1 and "holds checkpoints of an earlier run" in refused.output
    steps = [m["step"] for m in _metrics(trained["run"]) if "reward" in m]
    assert steps == sorted(steps) and steps[-1] == trained["stopped_at"] + 2
    assert [s for s in steps if s > trained["stopped_at"]] == [trained["stopped_at"] + 1, trained["stopped_at"] + 2]


def test_grpo_changed_the_weights_and_logged_each_term(trained):
    from safetensors.torch import load_file

    run = trained["run"]
    start = load_file(run / "warmup" / "model.safetensors")
    end = load_file(run / "model" / "model.safetensors")
    assert start.keys() == end.keys()
    assert any(not (start[k] == end[k]).all() for k in start)
    logged = [m for m in _metrics(run) if "reward" in m]
    for term in ("parses", "tool_name", "schema", "reference_match", "preserve_valid", "grounding", "clean_format"):
        assert all(f"rewards/{term}/mean" in m for m in logged), term
    assert all("frac_reward_zero_std" in m and "completions/mean_length" in m for m in logged)
    assert min(m["frac_reward_zero_std"] for m in logged) < 1  # some groups did not tie: there was something to learn
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    card = json.loads((run / "model" / "reviser.json").read_text())
    mined = json.loads((trained["mined"] / "dataset.json").read_text())["prompt_settings"]
    assert card["prompt_settings"] == mined and mined["max_tools"] == 1 and card["kind"] == "full"


def test_the_run_is_registered_with_its_eval_figures(trained, mined):
    assert "registered reviser-0001" in trained["resumed"].output
    result = CliRunner().invoke(main, ["models", "list", "--db", trained["db"], "--json"])
    (model,) = json.loads(result.output)
    assert model["kind"] == "full" and model["path"] == str(trained["run"] / "model")
    assert model["dataset_hash"] == json.loads((mined / "dataset.json").read_text())["content_hash"]
    assert model["config"]["prompt_settings"]["max_tools"] == 1 and model["config"]["warmup"]["steps"] == 40
    engine = make_engine(trained["db"])
    with engine.connect() as conn:
        exported = conn.execute(select(DatasetRow.id, DatasetRow.content_hash)).all()
    engine.dispose()
    assert [(model["dataset_id"], model["dataset_hash"])] == [tuple(r) for r in exported]  # linked to mine's export
    split = model["evaluation"]["eval"]
    assert split["cases"] == len((mined / "eval.jsonl").read_text().splitlines()) > 0
    assert split["model"]["cases"] == split["rules"]["cases"] == split["cases"]
    no_harm = model["evaluation"]["do-no-harm"]
    assert no_harm["model"]["valid_changed"] == 0 and no_harm["model"]["ok_rate"] == 1
    metrics = model["metrics"]
    assert metrics["steps"] == trained["stopped_at"] + 2 and metrics["step"][-1] == metrics["steps"]
    assert len(metrics["reward"]) == len(metrics["step"]) == len(metrics["rewards/schema/mean"])
    assert "reward" in metrics["final"] and "frac_reward_zero_std" in metrics
    table = CliRunner().invoke(main, ["models", "list", "--db", trained["db"]])
    assert "reviser-0001" in table.output and "full" in table.output


def test_model_reviser_in_eval_keeps_revise_contract(trained, mined):
    from tracemill.revisers import make_reviser
    from tracemill.revision import StepKind
    from tracemill.suites import read_cases
    from tracemill.tools import tool_index

    spec = f"model:{trained['run'] / 'model'}"
    result = CliRunner().invoke(main, ["eval", "--cases", str(mined / "eval.jsonl"), "--reviser", "rules",
                                       "--reviser", spec, "--json"])
    assert result.exit_code == 0, result.output
    by = {m["reviser"]: m for m in json.loads(result.stdout)["revisers"]}
    assert by[spec]["valid_changed"] == 0 and by[spec]["ok_rate"] >= by["rules"]["ok_rate"]
    reviser = make_reviser(spec)
    asked = 0
    for case in read_cases(mined / "eval.jsonl"):
        index = tool_index(case.tools)
        revision = reviser(case.raw, index, case.context)
        rules = make_reviser("rules")(case.raw, index, case.context)
        if any(s.kind is StepKind.MODEL for s in revision.steps):
            asked += 1
            assert revision.ok  # the model's answer is kept only when it is valid
        else:
            assert revision == rules  # otherwise what the rules made of the output stands
        if rules.ok and not rules.changed:
            assert revision == rules  # a call valid as sent is never changed
    assert asked <= len(read_cases(mined / "eval.jsonl"))


LAUNCHED = """
device = "cpu"
[model]
base = "{base}"
kind = "lora"
[data]
dataset = "{data}"
[warmup]
steps = 2
[grpo]
num_generations = 2
per_device_batch_size = 2
max_completion_length = 8
max_steps = 1
[output]
dir = "run"
tensorboard = false
[eval]
enabled = false
[launch]
num_processes = 2
mixed_precision = "no"
"""


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny, mined):
    """`tracemill train --db URL` of a LoRA after a warm-up, which relaunches itself under `accelerate launch` over two
    CPU processes; TRACEMILL_DATABASE_URL names another store."""
    folder = tmp_path_factory.mktemp("launched")
    (folder / "train.toml").write_text(LAUNCHED.format(base=tiny, data=mined))
    db = f"sqlite:///{folder / 'given.db'}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRACEMILL_DATABASE_URL": f"sqlite:///{folder / 'env.db'}"}
    done = subprocess.run([sys.executable, "-m", "tracemill.cli", "train", "--config", "train.toml", "--db", db],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "launching: " in done.stderr and "accelerate.commands.launch" in done.stderr
    listed = CliRunner().invoke(main, ["models", "list", "--db", db, "--json"])
    return {"folder": folder, "listed": listed}


def test_a_run_relaunched_under_accelerate_registers_in_the_store_given_with_db(launched):
    folder = launched["folder"]
    assert launched["listed"].exit_code == 0, launched["listed"].output
    (model,) = json.loads(launched["listed"].output)
    assert model["path"] == str(folder / "run" / "model")
    assert not (folder / "env.db").exists() and not (folder / "tracemill.db").exists()


def test_a_lora_trained_after_a_warm_up_is_registered_over_the_warm_up_model(launched):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tracemill.revisers import make_reviser

    (model,) = json.loads(launched["listed"].output)
    assert model["kind"] == "lora" and model["base_model"] == str(launched["folder"] / "run" / "warmup")
    assert model["config"]["model"]["base"] != model["base_model"]
    adapter = json.loads((Path(model["path"]) / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == model["base_model"]
    # `model:PATH` (what serves the version in-process) is the adapter over the base the registry names
    served = make_reviser(f"model:{model['path']}").model.state_dict()
    base = AutoModelForCausalLM.from_pretrained(model["base_model"])
    over = PeftModel.from_pretrained(base, model["path"]).merge_and_unload().state_dict()
    assert served.keys() == over.keys() and all(torch.equal(served[k], over[k]) for k in served)


def test_warm_up_trains_on_every_pair_whole_however_long_its_prompt(tiny, tmp_path):
    from dataclasses import replace

    from tracemill.reviser_prompt import PromptSettings
    from tracemill.trainer.fault_rows import prompt_row
    from tracemill.trainer.warmup import answer, sft_trainer

    # an agent's conversation, up to the default 1024 (approximate) tokens of it in the prompt, beside short prompts
    chat = [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"turn {i}: " + "the forecast said rain and more rain over the hills, " * 8} for i in range(40)]
    cases = fault_cases(0, sources=("bfcl",), max_calls=1)[:3]
    rows = [prompt_row(replace(c, context=[*chat, *(c.context or [])]), PromptSettings()) for c in cases]
    rows += [prompt_row(c, PromptSettings()) for c in cases]
    trainer = sft_trainer(str(tiny), rows, tmp_path, 1, 1e-4, 2, 0, "cpu")
    examples = list(trainer.train_dataset)
    tokenizer = trainer.processing_class
    learned = [tokenizer.decode([t for t in e["labels"] if t != -100]) for e in examples]
    assert learned == [f"{answer(r)}{tokenizer.eos_token}\n" for r in rows]
    assert max(len(e["input_ids"]) for e in examples) > 1024  # TRL's default max_length


def test_gpu_bench_passes_its_cpu_dry_run():
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "run.sh"
    result = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert [m["mode"] for m in figures["modes"]] == ["lora", "full"]
    assert all(m["s_per_step"] > 0 and m["train_tokens_per_s"] > 0 for m in figures["modes"])
    assert figures["generation_tokens_per_s"] > 0 and "s/step" in result.stdout


def test_model_reviser_loads_a_lora_adapter_over_its_base(tiny, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracemill.reviser_prompt import build_prompt
    from tracemill.revisers import make_reviser
    from tracemill.revision import StepKind
    from tracemill.tools import tool_index
    from tracemill.trainer.model_reviser import ReviserCard

    adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(
        r=4, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False))
    folder = tmp_path / "adapter"
    adapter.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    ReviserCard(str(tiny), "lora", COMPACT, 8).save(folder)
    reviser = make_reviser(f"model:{folder}")
    base = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    merged = reviser.model.state_dict()
    assert merged.keys() == base.keys() and any(not torch.equal(base[k], merged[k]) for k in base)
    index = tool_index([{"name": "get_weather", "inputSchema": {
        "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}])
    asked = []
    generate = reviser.generate
    reviser.generate = lambda messages: asked.append(messages) or generate(messages)
    cut = '{"name": "get_weather", "arguments": {"city": "Dub'
    revision = reviser(cut, index, None)  # cut short: the rules refuse it, so the model is asked
    assert not any(s.kind is StepKind.MODEL for s in revision.steps) or revision.ok
    assert asked == [build_prompt(cut, index, None, COMPACT).to_list()] and asked[0][0]["role"] == "user"
    valid = '{"name": "get_weather", "arguments": {"city": "Dublin"}}'
    assert reviser(valid, index, None) == make_reviser("rules")(valid, index, None) and len(asked) == 1
