"""FLUX.1, FLUX.2 (Klein, editing with references), Qwen-Image (and its edit) and Krea 2 across
a worker group of 2 gloo processes, each running its family's own predict: the tokens split by
diffusers' context parallelism (Ulysses), or the rows of every forward divided between the CFG
pair, give every job the latents it gets alone in one process, within float rounding — jobs of
several runs (sizes with an odd token count, guided and not, references or not) sharing the
group's forwards."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.parallel.conftest import CFG, TOLERANCE, ULYSSES
from workers.parallel.group import WorkerGroup
from workers.parallel.protocol import ModelRef

TEXT = ["a red cat on a mat", "a dog", ""]  # positives, and the negative


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[str, WorkerGroup]]:
    made = {"ulysses": WorkerGroup(2, step_timeout=60), "cfg": WorkerGroup(2, step_timeout=60)}
    yield made
    for group in made.values():
        group.close()


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family-split-models")


def _stack(models_dir: Path, family: str) -> tuple[Any, Any, list[Any], ModelRef]:
    """The family's tiny stack: its plugin, the transformer loaded here (the reference), the
    three prompts encoded, and the ModelRef the ranks load."""
    from workers.device.policy import DevicePolicy
    from workers.models.families import plugin

    family_plugin, policy = plugin(family), DevicePolicy(profile="cpu")
    names = family_plugin.write_tiny_stack(models_dir)
    encoders = [names[k] for k in ("text_encoder", "text_encoder_2") if k in names]
    encoder = family_plugin.load_text_encoder(models_dir, encoders, policy)
    single = family_plugin.load_diffusion_model(models_dir, names["model"], policy)
    return (family_plugin, single, family_plugin.encode_prompts(encoder, TEXT),
            ModelRef(str(models_dir), names["model"], "float32"))


def _references(family: str, positive: Any, seed: int) -> Any:
    """An edit prompt: `positive` with one reference latent of the family's own kind."""
    import torch

    generator = torch.Generator("cpu").manual_seed(100 + seed)
    if family == "flux2":
        return positive._replace(references=(torch.randn(1, 128, 2, 3, generator=generator),))
    from workers.models.qwenimage.engine import QwenPrompt

    return QwenPrompt(positive, (torch.randn(1, 16, 4, 6, generator=generator),))


# (width, height, guidance, edit): 64×48 and 48×48 px (an odd token count after 2×2 patches for
# the ÷8 families: 9 tokens, split 5 + 4)
SPECS: tuple[tuple[int, int, float, bool], ...] = (
    (64, 48, 3.0, False), (64, 48, 0.0, False), (48, 48, 2.0, True))


def _jobs(family: str, family_plugin: Any, prompts: list[Any]) -> list[Any]:
    import importlib

    import torch

    from workers.sampling import SampleJob

    latent = importlib.import_module(f"workers.models.{family}").FAMILY.latent
    jobs = []
    for seed, (width, height, guidance, edit) in enumerate(SPECS):
        if family == "flux1":  # FLUX.1 dev: distilled guidance, no CFG rows
            guidance = 0.0
        positive = prompts[seed % 2]
        if edit and family in ("flux2", "qwenimage"):
            positive = _references(family, positive, seed)
        sigmas, timesteps = family_plugin.schedule(3, width, height, 1.0)
        generator = torch.Generator("cpu").manual_seed(seed)
        jobs.append(SampleJob(
            latents=torch.randn(latent.shape(width, height), generator=generator),
            sigmas=sigmas, timesteps=timesteps, positive=positive,
            negative=prompts[2] if guidance > 0 else None, guidance=guidance,
            extra={"guidance": 3.5}))
    return jobs


def _together(group: WorkerGroup, jobs: list[Any], ref: ModelRef, degrees: Any) -> list[Any]:
    """Every job on the group at once (a thread each, as a worker's slots run them)."""
    results: dict[int, Any] = {}
    batch = group.batcher(ref, lambda _jobs: degrees, key=degrees)

    def render(i: int) -> None:
        results[i] = batch.run(jobs[i])

    threads = [threading.Thread(target=render, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return [results[i] for i in range(len(jobs))]


@pytest.mark.parametrize("family", ["flux1", "flux2", "qwenimage", "krea2"])
def test_a_family_split_by_tokens_then_by_cfg_rows_is_the_single_process_render(
        family: str, groups: dict[str, WorkerGroup], models_dir: Path) -> None:
    family_plugin, single, prompts, ref = _stack(models_dir, family)
    make: Callable[[], list[Any]] = lambda: _jobs(family, family_plugin, prompts)  # noqa: E731
    expected = [single.batcher.run(job) for job in make()]  # each alone, in this process

    for which, degrees in (("ulysses", ULYSSES), ("cfg", CFG)):
        group = groups[which]
        before = group.forwards
        jobs = make()
        batches: list[list[int]] = [[] for _ in jobs]
        for job, seen in zip(jobs, batches, strict=True):
            job.on_progress = lambda done, total, job=job, seen=seen: seen.append(job.batch)
        got = _together(group, jobs, ref, degrees)
        for spec, a, b in zip(SPECS, got, expected, strict=True):
            assert a.shape == b.shape
            assert float((a - b).abs().max()) <= TOLERANCE, (family, which, spec)
        # the runs shared forwards (fewer group forwards than their steps); the 48×48 job's
        # layout differs, so the family's predict ran it apart on the ranks, and its progress
        # `batch` says so
        assert group.forwards - before < 3 * len(SPECS), (family, which)
        assert max(batches[0] + batches[1]) == 2 and set(batches[2]) == {1}, batches
        report = group.last_report
        assert report["rows"] >= 1 and report["tokens"] >= 1
        if which == "ulysses":  # each rank holds half the tokens (rounded up), every row
            assert report["local_tokens"] == -(-report["tokens"] // 2)
            assert report["local_rows"] == report["rows"]
        else:  # each rank computes half the rows (rounded up), every token
            assert report["local_rows"] == -(-report["rows"] // 2)
            assert report["local_tokens"] == report["tokens"]
