"""The loader / patch / sampler nodes in a real ComfyUI 0.33 server with the pack (and a test-only node pack that loads
conditioning from a file): /object_info, graphs queued through /prompt, POST /interrupt mid-run, bad inputs that
must not take the server down, the example workflow validated up to its missing model files."""

from __future__ import annotations

import json
import os
import pathlib
import time
import urllib.request

import pytest
import torch
from comfy_check_run import CPU_PATHS, INT8_WHOLE_MODEL
from workflow_models import loader_node

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE_IDS = ("Ideogram4Int8Loader", "Ideogram4Int8Patch", "Ideogram4Int8Sampler")


def _cfg():
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config

    return Ideogram4Config.demo()


SEED = int.from_bytes(os.urandom(3), "little")


def _setup_files(base: pathlib.Path) -> None:
    from comfyui_ideogram4_int8.ideogram4 import synthetic
    from safetensors.torch import save_file
    from workflow_models import two_branch_weights

    models = base / "models" / "diffusion_models"
    models.mkdir(parents=True)
    cfg = _cfg()
    synthetic.write_w8a8(models / "i4_w8a8.safetensors", two_branch_weights(cfg, SEED), cfg)
    save_file({"encoder.conv_in.weight": torch.randn(8, 3, 3, 3)}, str(models / "flux2_vae_like.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    save_file({"cond": torch.randn(1, 6, cfg.llm_features_dim, generator=g)}, str(base / "cond.safetensors"))
    save_file({"cond": torch.randn(1, 77, 768, generator=g)}, str(base / "cond_clip_l.safetensors"))


@pytest.fixture(scope="module")
def srv():
    from comfyui_server import WITH_TEST_PACK, ComfyUIServer, started

    with started(ComfyUIServer(packs=WITH_TEST_PACK, setup=_setup_files)) as server:
        yield server


def _inputs(info):
    return {**info["input"].get("required", {}), **info["input"].get("optional", {})}


def test_object_info_lists_every_node_with_tooltips(srv):
    everything = srv.object_info()
    for node_id in NODE_IDS:
        info = everything[node_id]
        assert info["display_name"].startswith("Ideogram 4"), node_id
        assert info["category"].startswith("Ideogram 4 INT8/"), node_id
        for name, spec in _inputs(info).items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert everything["Ideogram4Int8Loader"]["output"] == ["MODEL", "MODEL", "STRING"]
    assert everything["Ideogram4Int8Patch"]["output"] == ["MODEL", "STRING"]
    assert everything["Ideogram4Int8Sampler"]["output"] == ["LATENT"]
    weights = _inputs(everything["Ideogram4Int8Loader"])["weights"]
    options = weights[1]["options"] if isinstance(weights[0], str) else weights[0]
    assert "i4_w8a8.safetensors" in options
    sampler = _inputs(everything["Ideogram4Int8Sampler"])
    assert sampler["width"][1]["default"] == 1024 and sampler["height"][1]["default"] == 1024
    width = sampler["width"][1]
    assert (width["step"], width["min"], width["max"]) == (16, 256, 2048)


def _cond(srv, name="cond.safetensors"):
    return {"class_type": "Ideogram4TestConditioning", "inputs": {"path": str(srv.base / name)}}


CUSTOM = {"steps": 4, "guidance": 7.0, "polish_steps": 1, "polish_guidance": 3.0, "mu": 0.0, "std": 1.75}


def _our_sampler(seed, **kw):
    inputs = {
        "model": ["1", 0],
        "model_negative": ["1", 1],
        "positive": ["2", 0],
        "seed": seed,
        "preset": "Turbo 12",
        "width": 256,
        "height": 256,
        "batch_size": 1,
        **CUSTOM,
    }
    inputs.update(kw)
    return {"class_type": "Ideogram4Int8Sampler", "inputs": inputs}


def _saved_latent(srv, entry, node="9"):
    from safetensors.torch import load_file

    info = entry["outputs"][node]["latents"][0]
    return load_file(str(srv.base / "output" / info["subfolder"] / info["filename"]))["latent_tensor"]


def _ok(entry):
    tracebacks = [
        "".join(d.get("traceback", [])) for kind, d in entry["status"]["messages"] if kind == "execution_error"
    ]
    assert entry["status"]["status_str"] == "success", "\n".join(tracebacks)


def test_loader_builds_both_models_through_prompt(srv):
    entry = srv.run_prompt({"1": loader_node(), "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}})
    _ok(entry)
    summary = entry["outputs"]["2"]["text"][0]
    assert summary.startswith("conditional: i4_w8a8.safetensors")
    assert "unconditional: i4_w8a8.safetensors" in summary
    assert summary.count(f"GEMM paths: {CPU_PATHS}") == 2  # the panel's words for this device, with the path ids
    assert "bf16-protected layers (2)" in summary


def _reference_latent(srv, seed, preset, width=256, height=256, **custom):
    """ideogram4.sample with the reference DiT on the server's file; custom inputs default to CUSTOM (as the node's)."""
    custom = {**CUSTOM, **custom} if preset == "custom" else {}
    from comfyui_ideogram4_int8.ideogram4 import Ideogram4DiT, make_noise, read_branch, sample, sampling_args
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_linears
    from safetensors.torch import load_file

    path = srv.base / "models" / "diffusion_models" / "i4_w8a8.safetensors"
    models = [
        Ideogram4DiT.from_state_dict(read_branch(path, b, dtype=torch.float32), w8a8_linears(), dtype=torch.float32)
        for b in ("conditional", "unconditional")
    ]
    ctx = load_file(str(srv.base / "cond.safetensors"))["cond"]
    plan = sampling_args.plan_sampling(preset, width, height, **custom)
    with torch.no_grad():
        return sample(
            models[0],
            models[1],
            ctx,
            width=width,
            height=height,
            sigmas=plan.sigmas,
            guidance=plan.guidance,
            noise=make_noise(seed, width, height, 1),
        )


def test_native_dual_model_guider_graph_runs_with_our_models(srv):
    seed = SEED % 10000
    graph = {
        "1": loader_node(),
        "2": _cond(srv),
        "3": {
            "class_type": "DualModelGuider",  # negative left unconnected: the image-only unconditional pass
            "inputs": {"model": ["1", 0], "model_negative": ["1", 1], "positive": ["2", 0], "cfg": 7.0},
        },
        "4": {
            "class_type": "Ideogram4Scheduler",
            "inputs": {"steps": 4, "width": 256, "height": 256, "mu": 0.0, "std": 1.75},
        },
        "5": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "6": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "7": {"class_type": "EmptyFlux2LatentImage", "inputs": {"width": 256, "height": 256, "batch_size": 1}},
        "8": {
            "class_type": "SamplerCustomAdvanced",
            "inputs": {
                "noise": ["5", 0],
                "guider": ["3", 0],
                "sampler": ["6", 0],
                "sigmas": ["4", 0],
                "latent_image": ["7", 0],
            },
        },
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "native"}},
        "10": _our_sampler(seed, preset="custom", polish_steps=0),
        "11": {"class_type": "SaveLatent", "inputs": {"samples": ["10", 0], "filename_prefix": "ours"}},
    }
    entry = srv.run_prompt(graph, timeout=300)
    _ok(entry)
    native, ours = _saved_latent(srv, entry, "9"), _saved_latent(srv, entry, "11")
    assert native.shape == (1, 128, 16, 16)
    assert (native - ours).abs().max().item() == 0.0  # same guider, sampler, sigmas and noise inside ComfyUI
    ref = _reference_latent(srv, seed, "custom", polish_steps=0)
    rel = ((native.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel <= INT8_WHOLE_MODEL, rel  # other torch build in this process: activation-rounding flips only


def test_sampler_node_latent_matches_the_reference_sampler(srv):
    seed = (SEED + 17) % 100000
    graph = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "turbo"}},
    }
    entry = srv.run_prompt(graph, timeout=300)
    _ok(entry)
    got = _saved_latent(srv, entry)
    ref = _reference_latent(srv, seed, "Turbo 12")
    rel = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel <= INT8_WHOLE_MODEL, rel
    other = _reference_latent(srv, seed + 1, "Turbo 12")
    assert ((got - other).norm() / other.norm()).item() > 0.1


def _interrupt(srv):
    req = urllib.request.Request(
        srv.url + "/interrupt", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_interrupt_mid_run_then_the_models_still_work(srv):
    seed = (SEED + 29) % 100000
    short = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed, preset="custom", steps=3),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "short"}},
    }
    first = srv.run_prompt(short, timeout=300)
    _ok(first)
    long = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed + 1, preset="custom", steps=200, width=1024, height=1024),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "long"}},
    }
    prompt_id = srv.queue_prompt(long)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the sampler is running
        running = srv.get_json("/queue")["queue_running"]
        if running and running[0][1] == prompt_id:
            break
        time.sleep(0.1)
    time.sleep(3.0)
    _interrupt(srv)
    entry = srv.wait_for_history(prompt_id, timeout=120)
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds, entry["status"]
    # the loader's MODELs (cached by ComfyUI) run again: a new seed, so the sampler is not answered from the cache
    again = srv.run_prompt(dict(short, **{"8": _our_sampler(seed + 2, preset="custom", steps=3)}), timeout=300)
    _ok(again)
    got = _saved_latent(srv, again)
    ref = _reference_latent(srv, seed + 2, "custom", steps=3)
    assert ((got.double() - ref.double()).norm() / ref.double().norm()).item() <= INT8_WHOLE_MODEL
    assert not torch.equal(got, _saved_latent(srv, first))


def _error_text(srv, graph):
    from comfyui_server import ComfyUIError, history_errors

    try:
        entry = srv.run_prompt(graph, timeout=300)
    except ComfyUIError as exc:  # rejected by validation (HTTP 400 with node_errors)
        return str(exc)
    assert entry["status"]["status_str"] == "error", "expected the run to fail"
    return "\n".join(history_errors(entry))


def test_bad_inputs_fail_with_clear_errors_and_the_server_stays_up(srv):
    wrong_file = dict(loader_node(), inputs=dict(loader_node()["inputs"], weights="flux2_vae_like.safetensors"))
    text = _error_text(srv, {"1": wrong_file, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}})
    assert "holds no Ideogram 4 DiT linears" in text and "flux2_vae_like.safetensors" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv, "cond_clip_l.safetensors"),
            "8": _our_sampler(1),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "[1, 77, 768]" in text and "CLIPLoader of type ideogram4" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "8": _our_sampler(1, width=1000),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "multiple of 16" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "8": _our_sampler(1, width=2048, height=256),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "6:1" in text
    text = _error_text(
        srv,
        {
            "3": {"class_type": "Ideogram4TestOtherModel", "inputs": {}},
            "4": {
                "class_type": "Ideogram4Int8Patch",
                "inputs": {"model": ["3", 0], "label": "conditional", "gemm_path": "auto"},
            },
            "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        },
    )
    assert "not an Ideogram 4 diffusion model" in text
    bad_negative = _our_sampler(1)
    bad_negative["inputs"]["model_negative"] = ["3", 0]
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "3": {"class_type": "Ideogram4TestOtherModel", "inputs": {}},
            "8": bad_negative,
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "'model_negative'" in text and "not an Ideogram 4 diffusion model" in text
    assert srv.proc.poll() is None
    assert srv.get_json("/system_stats")["system"]
    _ok(srv.run_prompt({"1": loader_node(), "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}}))


def test_example_workflow_validates_up_to_the_missing_model_files(srv):
    from comfyui_server import ComfyUIError

    graph = json.loads((ROOT / "example_workflows" / "api" / "ideogram4_int8_text_to_image_api.json").read_text())
    # the caption builder is an output node that validates, so ComfyUI accepts the prompt for that part and reports
    # the rest in node_errors (a prompt with no valid output at all is refused with HTTP 400 and the same errors)
    try:
        body = srv.post_json("/prompt", {"prompt": graph, "client_id": "validate"})
        srv.wait_for_history(body["prompt_id"])
    except ComfyUIError as err:
        body = json.loads(str(err).split(": ", 1)[1])
    errors = body["node_errors"]
    assert "return_type_mismatch" not in json.dumps(errors)
    problems = {
        (graph[k]["class_type"], e["extra_info"]["input_name"])
        for k, v in errors.items()
        for e in v["errors"]
        if e["type"] == "value_not_in_list"
    }
    assert problems == {("Ideogram4Int8Loader", "weights"), ("CLIPLoader", "clip_name"), ("VAELoader", "vae_name")}, (
        errors
    )
