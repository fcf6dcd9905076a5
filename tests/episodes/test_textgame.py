"""The episodic capability on a domain that is not SciWorld: a tiny deterministic text game
(textgame.py), registered with one registry line, played, replayed and trained through `distill run`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distill import registry
from distill.config import ConfigError, Sampling, resolve_config
from distill.episodes.data import IGNORE, episode_example, replay_gold
from distill.episodes.episode import ENV, frame_for
from distill.episodes.play import ScriptedAgent, handover, play, single

from .textgame import NAME, TextGame, TextGameConfig


@pytest.fixture
def game() -> TextGame:
    return TextGame(TextGameConfig())


def gold(game: TextGame, writer: str = "gold") -> ScriptedAgent:
    return ScriptedAgent(game.action_text, writer=writer)


def test_config_is_checked_against_the_registered_domain(registered: None) -> None:
    cfg = resolve_config(NAME, "rose", overrides=["method.student_turns=1", "domain.max_turns=4"])
    assert isinstance(cfg.domain, TextGameConfig) and cfg.domain.max_turns == 4
    with pytest.raises(
        ConfigError, match="method.prefix_tokens does not apply on the multi-turn domain textgame"
    ):
        resolve_config(NAME, "rose", overrides=["method.prefix_tokens=8"])
    with pytest.raises(ConfigError, match="domain.zzz"):
        resolve_config(NAME, "sft", overrides=["domain.zzz=1"])
    # Every method runs on episodes: OPSD's teacher reads the privileged view (test_episode_online).
    assert registry.method_target("opsd", NAME) == "distill.methods.episode_online:train_opsd"


def test_gold_play_masks_and_replay(game: TextGame, tiny_zoo: Any) -> None:
    """ROSE's split on gold episodes: env 0, student 0, teacher 1; the recorded gold play rebuilds
    the live token sequence exactly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    frame = frame_for(tok, None)
    items = [i for i in game.train_items() if len(i.meta["steps"]) >= 2]
    policy = handover(gold(game, "student"), gold(game, "teacher"), 1)
    episodes = play(game, items, policy, tok, frame, gold=True)
    for ep, item in zip(episodes, items, strict=True):
        assert ep.error is None and ep.done and ep.score == 100
        assert [t.action for t in ep.turns] == [s["action"] for s in item.meta["steps"]]
        assert [t.writer for t in ep.turns] == ["student"] + ["teacher"] * (len(ep.turns) - 1)
        assert ep.spans[0][0] == 0 and ep.spans[-1][1] == len(ep.ids)
        mask = ep.mask({"teacher"})
        for start, end, writer in ep.spans:
            assert set(mask[start:end]) == ({1} if writer == "teacher" else {0})
        assert ep.ids[ep.turn_spans()[0][1] - 1] == tok.eos_token_id
        assert sum(ep.ids[s] == tok.eos_token_id for s, _, w in ep.spans if w == ENV) == 0
        ids, labels = episode_example(ep, ["teacher"])
        assert sum(label != IGNORE for label in labels) == sum(mask)
    (live,) = play(game, items[:1], single(gold(game)), tok, frame, gold=True)
    offline = replay_gold(items[0], game, tok, frame)
    assert offline.ids == live.ids and offline.spans == live.spans and offline.score == live.score == 100


@pytest.mark.parametrize("stop", [True, False])
def test_a_turn_ends_at_the_domains_turn_end(stop: bool, tiny_zoo: Any) -> None:
    """A writer that runs on past its action line: with the domain's `turn_end` the turn is its
    ids up to the action, then an EOS the writer owns; without it the whole text stays."""
    from transformers import AutoTokenizer

    game = TextGame(TextGameConfig(stop_at_action=stop))
    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    chatty = ScriptedAgent(lambda a: f"Action: {a}\nThe counter is at 42. The target is 7.", writer="student")
    items = [i for i in game.train_items() if len(i.meta["steps"]) >= 2][:2]
    for ep, item in zip(
        play(game, items, single(chatty), tok, frame_for(tok, None), gold=True), items, strict=True
    ):
        assert ep.error is None and ep.score == 100
        for turn, step in zip(ep.turns, item.meta["steps"], strict=True):
            assert turn.action == step["action"] and not turn.truncated and turn.ids[-1] == tok.eos_token_id
            assert turn.stopped == stop
            full = tok(chatty.action_text(step["action"]), add_special_tokens=False)["input_ids"]
            if stop:
                assert turn.response == f"Action: {step['action']}"
                assert turn.ids[:-1] == full[: len(turn.ids) - 1] and len(turn.ids) - 1 < len(full)
            else:
                assert turn.ids[:-1] == full
        mask = ep.mask({"student"})
        assert sum(mask) == sum(len(t.ids) for t in ep.turns)  # the EOS of a cut turn is the writer's


def test_invalid_action_and_turn_budget(game: TextGame, tiny_zoo: Any) -> None:
    from transformers import AutoTokenizer

    from distill.engines.base import Completion

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)

    class Scripted:
        writer = "student"
        texts = ["thinking", "Action: sideways", "Action: up"]

        def act(self, episodes):  # type: ignore[no-untyped-def]  # a scripted test agent
            out = []
            for ep in episodes:
                text = self.texts[min(len(ep.turns), 2)]
                out.append(
                    Completion(
                        ids=tok(text, add_special_tokens=False)["input_ids"], text=text, truncated=True
                    )
                )
            return out

    item = game._items(1, 5, "t")[0]
    (ep,) = play(game, [item], lambda ep: Scripted(), tok, frame_for(tok, None), max_turns=3)
    assert ep.error is None and len(ep.turns) == 3
    assert [t.valid for t in ep.turns] == [False, False, True]
    assert ep.turns[0].observation == game.script.invalid_feedback  # no env step for it
    assert ep.moves == 1
    record = ep.record(game)
    assert record["invalid_actions"] == 2 and record["truncated_turns"] == 3
    # SFT's `valid_turns_only`: the turn without an action and the one the game refused stay in
    # the context, unlabelled; the accepted one is labelled.
    spans = ep.turn_spans()
    every, accepted = ep.mask({"student"}), ep.mask({"student"}, valid_only=True)
    assert [set(every[s:e]) for s, e, _ in spans] == [{1}, {1}, {1}]
    assert [set(accepted[s:e]) for s, e, _ in spans] == [{0}, {0}, {1}]
    ids, labels = episode_example(ep, ["student"], valid_only=True)
    start, end, _ = spans[2]
    assert [i for i, label in enumerate(labels) if label != IGNORE] == list(range(start, end))
    assert labels[start:end] == ids[start:end] == ep.turns[2].ids


@pytest.mark.integration
@pytest.mark.parametrize("method", ["sft", "rose", "opd"])
def test_distill_run_trains_on_the_new_domain(
    method: str, registered: None, tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`distill run --domain textgame --method X`: the episode version of each method trains,
    evaluates by playing, and logs the env/ figures."""
    from distill.cli.app import app

    monkeypatch.setenv("DISTILL_WORKSPACE", str(tmp_path / "ws"))
    args = [
        "run",
        "--domain",
        NAME,
        "--method",
        method,
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        "domain.max_turns=3",
        "optim.max_steps=2",
        "optim.batch_size=2",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=1",
        "rollout.max_new_tokens=8",
        "eval.max_new_tokens=8",
        "eval.items=2",
        "checkpoint.every_steps=0",
        f"tracking.run_name=tg-{method}",
        "threads=1",
    ]
    args += {
        "sft": ["method.keep_verified_only=false"],
        "rose": ["method.student_turns=1", "method.student_turns_min=null", "method.teacher_max_tokens=8"],
        "opd": [],
    }[method]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "ws" / "runs" / f"tg-{method}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["domain"] == NAME
    for key in ("student_before", "student_after"):
        assert summary[key]["items"] == 2 and 0.0 <= summary[key]["score"] <= 1.0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert [r["step"] for r in rows if f"eval/{NAME}/score" in r] == [0, 2]
    merged = {k: v for r in rows for k, v in r.items()}
    for key in ("env/turns_mean", "env/invalid_action_rate", "env/score_mean"):
        assert key in merged, key
    if method == "rose":
        train_rows = [r for r in rows if "train/loss" in r]
        assert all(r["env/student_turns_mean"] <= 1.0 for r in train_rows) and "train/ce_loss" in merged
        assert "teacher/ce_target_share" in merged
    if method == "opd":
        assert "kl/reverse_kl_mean" in merged
    if method == "sft":
        assert (run_dir / "data" / "teacher_episodes.jsonl").exists() and "teacher/ce_target_share" in merged


def test_an_episode_that_fills_the_context_ends_failed_not_past_it(game: TextGame, tiny_zoo: Any) -> None:
    """The context policy on episodes: a turn that would start past the model's positions is not
    written; the episode ends, failed with the reason (counted in env/failed_episodes)."""
    from distill.engines.hf import HFEngine
    from distill.episodes.play import EngineAgent

    engine = HFEngine.load(str(tiny_zoo.student))
    frame = frame_for(engine.tokenizer, None)
    (gold_play,) = play(game, game.train_items()[:1], single(gold(game)), engine.tokenizer, frame, gold=True)
    start = gold_play.spans[0][1]  # the instruction and first observation, before turn 1
    engine.model.config.max_position_embeddings = start + 40  # room for about one turn
    agent = EngineAgent(engine, "student", Sampling(8))
    (ep,) = play(game, game.train_items()[:1], single(agent), engine.tokenizer, frame, max_turns=6)
    assert ep.failed and ep.error is not None and ep.error.startswith("context full")
    assert 1 <= len(ep.turns) < 6
    assert len(ep.ids) >= engine.context  # it stopped where the context ran out, not earlier
