"""The AgentGym item index on the real simulator, item lists, and the agent eval with a tiny model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from distill.domains.sciworld import SciWorldDomain
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.index import EXCLUDED_TASKS, read_item_list, stratified_sample, task_table
from distill.domains.sciworld.pool import EnvPool

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def domain(sw_pool: EnvPool) -> SciWorldDomain:
    return SciWorldDomain(SciWorldDomainConfig(train_size=2, eval_size=4, pool_size=2), pool=sw_pool)


def test_index_follows_env_tasks_order(domain: SciWorldDomain, sw_pool: EnvPool) -> None:
    index = domain.agentgym_index()
    tasks = [t for t in task_table() if t not in EXCLUDED_TASKS]
    assert len(tasks) == 23
    # task types appear in env.tasks order, each as one contiguous block of all its variations
    order = list(dict.fromkeys(e.task_id for e in index))
    assert order == tasks
    counts = sw_pool.call(0, "max_variations", [task_table()[t] for t in tasks])
    assert Counter(e.task_id for e in index) == {t: counts[task_table()[t]] for t in tasks}
    assert [e.index for e in index] == list(range(len(index)))
    assert index[0].item_id == "sciworld_0" and (index[0].task_id, index[0].variation) == ("1-1", 0)
    first_42 = next(e for e in index if e.task_id == "4-2")
    assert first_42.variation == 0
    assert first_42.index == sum(counts[task_table()[t]] for t in tasks[: tasks.index("4-2")])


def test_stratified_sample_and_item_lists(domain: SciWorldDomain, tmp_path: Path) -> None:
    index = domain.agentgym_index()
    sample = stratified_sample(index, 200, seed=3)
    assert len(sample) == 200 and len({e.index for e in sample}) == 200
    per_task = Counter(e.task_id for e in sample)
    assert len(per_task) == 23 and max(per_task.values()) - min(per_task.values()) <= 1
    assert sample == stratified_sample(index, 200, seed=3)
    assert sample != stratified_sample(index, 200, seed=4)

    listed = tmp_path / "test.json"
    listed.write_text(json.dumps(["sciworld_0", "sciworld_17", {"item_id": "sciworld_5"}]))
    assert [e.index for e in read_item_list(listed, index)] == [0, 17, 5]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(["sciworld_x"]))
    with pytest.raises(ValueError, match="bad.json entry 0"):
        read_item_list(bad, index)
    bad.write_text(json.dumps([f"sciworld_{len(index)}"]))
    with pytest.raises(ValueError, match="outside the index"):
        read_item_list(bad, index)


def test_domain_items_come_from_the_simulator_splits(domain: SciWorldDomain, sw_pool: EnvPool) -> None:
    train, evals = domain.train_items(), domain.eval_items()
    assert {i.meta["task_id"] for i in train} == set(domain.config.tasks)
    for item in train:
        # a gold play reached the full score and its steps are recorded
        assert item.meta["gold_score"] == 100 and item.meta["steps"]
        assert item.prompt.startswith("Your task is")
    splits = {t: sw_pool.call(0, "splits", task_table()[t]) for t in domain.config.tasks}
    # train_on_dev (the default): training items from the train and dev splits, never test.
    train_split = {t: set(s["train"]) | set(s["dev"]) for t, s in splits.items()}
    assert all(i.meta["variation"] in train_split[i.meta["task_id"]] for i in train)
    assert all(i.meta["variation"] in splits[i.meta["task_id"]]["test"] for i in evals)
    assert not {(i.meta["task_id"], i.meta["variation"]) for i in train} & {
        (i.meta["task_id"], i.meta["variation"]) for i in evals
    }
    only_train = SciWorldDomain(domain.config.model_copy(update={"train_on_dev": False}), pool=sw_pool)
    assert all(i.meta["variation"] in splits[i.meta["task_id"]]["train"] for i in only_train.train_items())


def test_agent_eval_reports_the_three_metrics(domain: SciWorldDomain, tiny_zoo) -> None:  # type: ignore[no-untyped-def]
    from distill.config import EvalConfig
    from distill.engines.hf import HFEngine
    from distill.evals.agent import evaluate_agent

    engine = HFEngine.load(str(tiny_zoo.student))
    items, source = domain.benchmark_items("agentgym", None, 4, seed=0)
    assert "stratified sample of 4 items" in source and "seed 0" in source
    domain = SciWorldDomain(domain.config.model_copy(update={"max_turns": 2}), pool=domain.pool())
    cfg = EvalConfig(max_new_tokens=8)
    result = evaluate_agent(engine, domain, items, cfg, show_progress=False)
    m = result.metrics
    for key in ("score", "success", "pass_gt0", "turns_mean", "invalid_action_rate", "episodes_per_min"):
        assert key in m
    assert m["items"] == 4 and m["failed"] == 0
    assert 0.0 <= m["success"] <= m["pass_gt0"] <= 1.0
    assert 1 <= m["turns_mean"] <= 2
    assert {k.split("/")[1] for k in m if k.startswith("task/")} == {i.meta["task_id"] for i in items}
    assert [r["id"] for r in result.rows] == [i.id for i in items]
    # greedy: the same items give the same episodes
    again = evaluate_agent(engine, domain, items, cfg, show_progress=False)
    assert [r["actions"] for r in again.rows] == [r["actions"] for r in result.rows]
