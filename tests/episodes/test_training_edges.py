"""The episode methods at their edges, on the text game (textgame.py) with the tiny zoo's real
models and tokenizers: a cross-family teacher's turns go through the real TokenizerBridge turn by
turn (special tokens by role, never as text; a lossy seam is flagged and counted), its budget
figures count its own tokens, every gradient-accumulation micro-batch draws its own stream,
the same one again when the run is resumed, and ROSE's `keep_verified_only` trains on the
successful episodes alone, and SFT's `valid_turns_only` drops an episode with no accepted turn."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from distill.config import Sampling
from distill.engines.base import Completion
from distill.episodes.data import BridgedAgent, seam_failure_rate
from distill.episodes.episode import Episode, frame_for
from distill.episodes.play import EngineAgent, handover, play
from distill.methods.budget import teacher_turns
from distill.tokenizer_bridge.bridge import TokenizerBridge

from .runs import textgame_context
from .textgame import TextGame, TextGameConfig


class Scripted(EngineAgent):
    """A real engine's agent whose turns are given texts, encoded by its own tokenizer as plain
    text (+ EOS): the writer is not what these tests test, the bridge around it is. `views` keeps
    the token sequences it was asked to continue."""

    def __init__(self, engine: Any, writer: str, texts: Sequence[str], raw: list[int] | None = None) -> None:
        super().__init__(engine, writer, Sampling(64))
        self.texts, self.raw = texts, raw
        self.views: list[Episode] = []

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        tok = self.engine.tokenizer
        out = []
        for ep in episodes:
            self.views.append(ep)
            text = self.texts[min(len(ep.turns), len(self.texts) - 1)]
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if self.raw is not None:  # ids the tokenizer would not produce from text
                ids = ids[:3] + self.raw + ids[3:]
            out.append(Completion(ids=[*ids, tok.eos_token_id], text=text, truncated=False))
        return out


@pytest.fixture(scope="module")
def engines(tiny_zoo: Any) -> tuple[Any, Any]:
    from distill.engines.hf import HFEngine

    return HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher_llama))


def _far_item(game: TextGame) -> Any:
    """An item at least 3 moves from its target: the teacher writes two turns before it ends."""
    return next(i for i in game.train_items() if len(i.meta["steps"]) >= 3)


def _play_bridged(
    engines: tuple[Any, Any], teacher_texts: list[str], raw: list[int] | None = None, stop: bool = False
) -> Any:
    student, teacher = engines
    game = TextGame(TextGameConfig(max_turns=3, stop_at_action=stop))
    item = _far_item(game)
    move = item.meta["steps"][0]["action"]
    # Qwen has no <|eot_id|>: the student spelled it as ordinary text, which must stay text.
    me = Scripted(student, "student", [f"Thought: <|eot_id|> stays text.\n\nAction: {move}"])
    them = Scripted(teacher, "teacher", [t.format(move=move) for t in teacher_texts], raw)
    bridge = TokenizerBridge(student.tokenizer, teacher.tokenizer)
    bridged = BridgedAgent(them, game.script, bridge, game.turn_end)
    tok = student.tokenizer
    (ep,) = play(game, [item], handover(me, bridged, 1), tok, frame_for(tok, None))
    return ep, them, bridge


def test_bridged_turns_cross_special_tokens_by_role_never_as_text(engines: tuple[Any, Any]) -> None:
    student, teacher = engines
    qwen, llama = student.tokenizer, teacher.tokenizer
    # Llama has no <|im_end|> and groups digits by three (qwen: one token per digit).
    ep, them, _ = _play_bridged(engines, ["Count 123456789, <|im_end|> is text.\n\nAction: {move}"])
    assert [t.writer for t in ep.turns] == ["student", "teacher", "teacher"] and ep.error is None
    # The teacher read the student's turn in llama ids: its only end-of-turn is the real one.
    first_view = them.views[0]
    student_turn = first_view.turns[0].ids
    assert student_turn.count(llama.eos_token_id) == 1 and student_turn[-1] == llama.eos_token_id
    assert "<|eot_id|> stays text" in llama.decode(student_turn)
    for turn in ep.turns[1:]:
        # The teacher's turn in qwen ids: EOS by role at the end only, "<|im_end|>" kept as text.
        assert turn.ids.count(qwen.eos_token_id) == 1 and turn.ids[-1] == qwen.eos_token_id
        assert "<|im_end|> is text" in qwen.decode(turn.ids[:-1])
        own = len(llama(turn.response, add_special_tokens=False)["input_ids"]) + 1  # + its EOS
        assert turn.seam_ok and turn.source_tokens == own
        assert turn.response.startswith("Count 123456789") and turn.action is not None
    assert ep.seam_ok and seam_failure_rate([ep]) == 0.0


def test_a_bridged_teachers_budget_is_counted_in_its_own_tokens(engines: tuple[Any, Any]) -> None:
    """teacher/ce_target_* divide the teacher's own token counts by its budget t (both teacher
    tokens), not the student tokens its turns became."""
    ep, them, _ = _play_bridged(engines, ["Count 123456789 987654321.\n\nAction: {move}"])
    llama = engines[1].tokenizer
    teacher_lengths = [
        len(llama(t.response, add_special_tokens=False)["input_ids"]) + 1
        for t in ep.turns
        if t.writer == "teacher"
    ]
    student_lengths = [t.tokens for t in ep.turns if t.writer == "teacher"]
    assert teacher_lengths != student_lengths  # 18 digits: 6 llama tokens, 18 qwen tokens
    figures = teacher_turns([ep], budget=32)
    mean = sum(teacher_lengths) / len(teacher_lengths)
    assert figures["teacher/ce_target_tokens_mean"] == mean
    assert figures["teacher/ce_target_tokens_max"] == max(teacher_lengths)
    assert figures["teacher/ce_target_share"] == mean / 32


def test_a_bridged_turn_ends_at_the_domains_turn_end(engines: tuple[Any, Any]) -> None:
    """A cross-family teacher that runs on past its action (an invented observation, a second
    `Action:`) is cut at the domain's turn end, as a same-family turn is: the episode, the action
    parsed and the teacher's own view of its turn next time all end there, with its EOS."""
    run_on = "Go {move}.\nAction: {move}\nThe counter is at 42.\nAction: jump"
    ep, them, _ = _play_bridged(engines, [run_on], stop=True)
    qwen, llama = engines[0].tokenizer, engines[1].tokenizer
    teacher = [t for t in ep.turns if t.writer == "teacher"]
    assert len(teacher) == 2 and ep.error is None
    for turn in teacher:
        assert turn.stopped and turn.action != "jump" and "counter" not in turn.response
        assert turn.response.endswith(f"Action: {turn.action}") and turn.ids[-1] == qwen.eos_token_id
        assert "counter" not in qwen.decode(turn.ids) and turn.seam_ok
        assert turn.source_tokens == len(llama(turn.response, add_special_tokens=False)["input_ids"]) + 1
    # The teacher's next view holds its first turn as the episode does: cut, then its EOS.
    mine = them.views[1].turns[1].ids
    assert "counter" not in llama.decode(mine) and mine[-1] == llama.eos_token_id
    # Without the domain's turn end (stop_at_action off) the whole text stays, as before.
    ep, _, _ = _play_bridged(engines, [run_on], stop=False)
    assert all(t.action == "jump" and not t.stopped for t in ep.turns if t.writer == "teacher")


def test_a_lossy_seam_is_flagged_and_its_special_never_leaks(engines: tuple[Any, Any]) -> None:
    """A teacher special with no student counterpart (<|start_header_id|>) is dropped, never
    written as text, and marks the turn and its episode as not crossed losslessly."""
    llama = engines[1].tokenizer
    header = llama.convert_tokens_to_ids("<|start_header_id|>")
    ep, _, _ = _play_bridged(engines, ["Thinking.\n\nAction: {move}"], raw=[header])
    teacher = [t for t in ep.turns if t.writer == "teacher"]
    assert teacher and not any(t.seam_ok for t in teacher)
    assert not ep.seam_ok and seam_failure_rate([ep]) == 1.0
    assert "start_header" not in engines[0].tokenizer.decode(ep.ids)


def _context(run_dir: Path, tiny_zoo: Any, resume: Path | None = None) -> Any:
    from distill.config import RunConfig

    domain_cfg = TextGameConfig(max_turns=4, train_size=16)
    config = RunConfig.model_validate(
        {
            "domain": domain_cfg.model_dump(),
            "method": {"name": "rose", "student_turns": 3, "student_turns_min": 0, "teacher_max_tokens": 8},
            "rollout": {"prompts_per_step": 4, "num_generations": 1, "max_new_tokens": 8, "temperature": 1.0},
            "optim": {"lr": 1e-3, "max_steps": 2, "grad_accum": 2},
            "checkpoint": {"every_steps": 1},
            "eval": {"eval_teacher": False},
            "seed": 3,
        }
    )
    return textgame_context(run_dir, domain_cfg, config, tiny_zoo.student, tiny_zoo.teacher, resume)


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, tuple[int, ...], list[list[int]]]]:
    """Every micro-batch's (step, its N per episode, its episodes' token ids)."""
    from distill.methods import episode_online

    calls: list[tuple[int, tuple[int, ...], list[list[int]]]] = []
    real = episode_online.play_batch

    def spy(ctx: Any, engine: Any, items: list[Any], rng: Any) -> list[Episode]:
        draws = tuple(random_copy(rng).randint(0, 3) for _ in range(8))
        episodes = real(ctx, engine, items, rng)
        calls.append((len(calls), draws, [list(ep.ids) for ep in episodes]))
        return episodes

    monkeypatch.setattr(episode_online, "play_batch", spy)
    return calls


def random_copy(rng: Any) -> Any:
    import random

    copy = random.Random()
    copy.setstate(rng.getstate())
    return copy


@pytest.mark.integration
def test_micro_batches_draw_their_own_streams_and_a_resume_draws_them_again(
    registered: None, tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distill.methods.episode_online import train

    calls = _recorded(monkeypatch)
    train(_context(tmp_path / "run", tiny_zoo))
    assert len(calls) == 4  # 2 steps x 2 micro-batches
    (_, d1, _), (_, d2, _), (_, d3, e3), (_, d4, e4) = calls
    # Every micro-batch of a step, and every step, has its own stream of draws.
    assert len({d1, d2, d3, d4}) == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]

    # Resumed from step 1's checkpoint: step 2 draws what the uninterrupted run drew, N and tokens.
    calls.clear()
    checkpoint = tmp_path / "run" / "checkpoints" / "step-1"
    assert checkpoint.is_dir()
    train(_context(tmp_path / "resumed", tiny_zoo, resume=checkpoint))
    assert [(d, e) for _, d, e in calls] == [(d3, e3), (d4, e4)]


@pytest.mark.integration
def test_rose_keep_verified_only_trains_on_successful_episodes_alone(
    registered: None, tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """method.keep_verified_only: ROSE's CE takes the episodes that end in success and no other;
    a step none of whose episodes succeeds leaves the weights as they were. The teacher here is
    the game's gold script on the first `wins` items of a step and a wrong action on the rest,
    so which episodes succeed is known; everything else (play, CE, the Trainer) is the run's."""
    from safetensors.torch import load_file

    from distill.config import RunConfig
    from distill.episodes.play import ScriptedAgent
    from distill.methods import episode_online

    domain_cfg = TextGameConfig(max_turns=6, train_size=16)
    config = RunConfig.model_validate(
        {
            "domain": domain_cfg.model_dump(),
            "method": {"name": "rose", "student_turns": 0, "keep_verified_only": True},
            "rollout": {"prompts_per_step": 4, "num_generations": 1, "max_new_tokens": 8},
            "optim": {"lr": 1e-2, "max_steps": 2},
            "checkpoint": {"every_steps": 1},
            "eval": {"eval_teacher": False},
        }
    )
    ctx = textgame_context(tmp_path / "run", domain_cfg, config, tiny_zoo.student, tiny_zoo.teacher)
    game = ctx.domain
    wins = iter([2, 0])  # step 1: two episodes succeed; step 2: none
    played: list[list[Episode]] = []

    def scripted_play(ctx: Any, engine: Any, items: list[Any], rng: Any) -> list[Episode]:
        n = next(wins)
        gold = ScriptedAgent(game.action_text, writer="teacher")
        wrong = ScriptedAgent(lambda _: "Action: jump", writer="teacher", script=lambda _: [])
        tok = ctx.student.tokenizer
        first = {item.id for item in items[:n]}
        episodes = play(
            game,
            items,
            lambda ep: gold if ep.item.id in first else wrong,
            tok,
            frame_for(tok, None),
            gold=True,
        )
        played.append(episodes)
        return episodes

    trained: list[list[list[int]]] = []
    real_ce_step = episode_online.EpisodeTrainer.ce_step

    def ce_step(self: Any, model: Any, examples: Any) -> Any:
        trained.append([list(ids) for ids, _ in examples])
        return real_ce_step(self, model, examples)

    monkeypatch.setattr(episode_online, "play_batch", scripted_play)
    monkeypatch.setattr(episode_online.EpisodeTrainer, "ce_step", ce_step)
    episode_online.train(ctx)

    won = [[ep for ep in eps if game.solved(ep.score)] for eps in played]
    assert [len(w) for w in won] == [2, 0] and all(len(eps) == 4 for eps in played)
    # Step 1's CE saw exactly its two successful episodes; step 2 had none to train on.
    assert trained == [[list(ep.ids) for ep in won[0]]]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kept = {r["step"]: r["teacher/kept_rate"] for r in rows if "teacher/kept_rate" in r}
    assert kept == {1: 0.5, 2: 0.0}
    checkpoints = tmp_path / "run" / "checkpoints"
    step1, step2 = (load_file(str(checkpoints / f"step-{s}" / "model.safetensors")) for s in (1, 2))
    start = load_file(str(Path(tiny_zoo.student) / "model.safetensors"))
    assert any(not _equal(start[k], step1[k]) for k in start)  # step 1 trained
    assert all(_equal(step1[k], step2[k]) for k in step1)  # step 2 did not


def _equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


@pytest.mark.integration
def test_sft_valid_turns_only_drops_episodes_with_no_accepted_turn_and_refuses_when_none_is_left(
    registered: None, tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """method.valid_turns_only with keep_verified_only off: an episode the game refused every
    teacher action of labels nothing and is not trained on; when no kept episode labels anything,
    the run stops with one clear line (not a NaN loss over no tokens). The teacher is the game's
    gold script on the first `wins` items and a refused action on the rest; play, the rows and
    the TRL trainer are the run's."""
    from distill.config import RunConfig
    from distill.episodes import play as play_module
    from distill.episodes.play import ScriptedAgent
    from distill.methods import episode_sft

    domain_cfg = TextGameConfig(max_turns=3, train_size=4)
    config = RunConfig.model_validate(
        {
            "domain": domain_cfg.model_dump(),
            "method": {"name": "sft", "keep_verified_only": False, "valid_turns_only": True},
            "rollout": {"max_new_tokens": 8},
            "optim": {"lr": 1e-3, "max_steps": 1, "batch_size": 4},
            "eval": {"eval_teacher": False},
        }
    )
    real_play = play_module.play
    for wins, run in ((2, "mixed"), (0, "refused")):

        def scripted(
            domain: Any, items: list[Any], _agents: Any, *args: Any, n: int = wins, **kw: Any
        ) -> Any:
            gold = ScriptedAgent(domain.action_text, writer="teacher")
            wrong = ScriptedAgent(lambda _: "Action: jump", writer="teacher", script=lambda _: [])
            first = {item.id for item in items[:n]}
            policy = lambda ep: gold if ep.item.id in first else wrong  # noqa: E731
            return real_play(domain, items, policy, *args, **{**kw, "gold": True})

        monkeypatch.setattr(episode_sft, "play", scripted)  # the name the method calls
        ctx = textgame_context(tmp_path / run, domain_cfg, config, tiny_zoo.student, tiny_zoo.teacher)
        if wins == 0:
            with pytest.raises(ValueError, match="accepted no action of the teacher"):
                episode_sft.train(ctx)
            continue
        episode_sft.train(ctx)
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        kept = [r["teacher/kept_trajectories"] for r in rows if "teacher/kept_trajectories" in r]
        assert kept == [2.0]
        saved = (tmp_path / run / "data" / "teacher_episodes.jsonl").read_text().splitlines()
        assert len(saved) == 4  # every episode is kept on record; two label nothing
