"""OPSD on episodes: the teacher (the student's own weights) scores every turn in its privileged
view, the first user message rewritten by `method.teacher_template`; every later token is the
student's, scored where it sits in the student's sequence. On the text game (tests/episodes) with
the tiny zoo's real student."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# tests/ is on sys.path (rootdir conftest): the text game of tests/episodes.
from episodes.runs import textgame_context
from episodes.textgame import TextGameConfig

from distill.episodes.episode import frame_for
from distill.episodes.play import ScriptedAgent, play, single


def _context(tmp_path: Path, tiny_zoo: Any, template: str | None = None, every_turn: bool = False) -> Any:
    from distill.config import RunConfig

    domain_cfg = TextGameConfig(max_turns=4, train_size=16)
    method: dict[str, Any] = {"name": "opsd", "privileged_every_turn": every_turn}
    if template is not None:
        method["teacher_template"] = template
    config = RunConfig.model_validate(
        {"domain": domain_cfg.model_dump(), "method": method, "student": {"name": str(tiny_zoo.student)}}
    )
    # OPSD's teacher is the student's own (step-0) weights.
    return textgame_context(tmp_path, domain_cfg, config, tiny_zoo.student, tiny_zoo.student)


def _episodes(ctx: Any) -> list[Any]:
    game = ctx.domain
    items = [i for i in game.train_items() if len(i.meta["steps"]) >= 2][:3]
    tok = ctx.student.tokenizer
    return play(
        game, items, single(ScriptedAgent(game.action_text, writer="student")), tok, frame_for(tok, None)
    )


def test_opsd_scores_every_turn_in_the_privileged_view(
    registered: None, tiny_zoo: Any, tmp_path: Path
) -> None:
    from distill.methods.episode_online import _teacher_scores
    from distill.methods.views import teacher_message

    ctx = _context(tmp_path, tiny_zoo)
    episodes = _episodes(ctx)
    scores = _teacher_scores(ctx, episodes, top_k=0)
    assert scores.logprobs_B_T.shape[1] == max(len(ep.ids) for ep in episodes) - 1
    tok = ctx.student.tokenizer
    secret = ctx.domain.privileged_context(episodes[0].item).strip()
    for i, ep in enumerate(episodes):
        view, end = ep.privileged_prompt(
            teacher_message(ctx.config.method, ctx.domain, ep.item, ep.first_message)
        )
        assert secret in tok.decode(view) and secret not in tok.decode(ep.ids)  # the teacher's view only
        assert end == ep.spans[0][1] and len(view) > end
        direct = ctx.teacher.score([view], [ep.ids[end:]])
        n = len(ep.ids) - end
        # Placed where the tokens sit in the student's sequence (position t predicts ids[t + 1]).
        torch.testing.assert_close(scores.logprobs_B_T[i, end - 1 : end - 1 + n], direct.logprobs_B_T[0, :n])
        assert not scores.mask_B_T[i, : end - 1].any() and scores.mask_B_T[i, end - 1 : end - 1 + n].all()
        turns = torch.tensor(ep.mask({"student"})[1:], dtype=torch.bool)
        assert turns[: end - 1].sum() == 0 and turns.sum() > 0  # every student token is scored
    plain = ctx.teacher.score([ep.ids[:1] for ep in episodes], [ep.ids[1:] for ep in episodes])
    turns_B_T = torch.zeros_like(plain.mask_B_T, dtype=torch.bool)
    for i, ep in enumerate(episodes):
        turns_B_T[i, : len(ep.ids) - 1] = torch.tensor(ep.mask({"student"})[1:], dtype=torch.bool)
    widened = scores.widened(plain.logprobs_B_T.shape[1])
    gap = (widened.logprobs_B_T - plain.logprobs_B_T)[turns_B_T].abs().max()
    assert gap > 1e-4  # the privileged context changes what the teacher expects


def test_without_privilege_opsd_scores_are_opds(registered: None, tiny_zoo: Any, tmp_path: Path) -> None:
    """`teacher_template="{problem}"` gives the teacher the student's own view: the placed scores
    are the plain ones, to float precision, at every position after the first span."""
    from distill.methods.episode_online import _teacher_scores

    ctx = _context(tmp_path, tiny_zoo, template="{problem}")
    episodes = _episodes(ctx)
    scores = _teacher_scores(ctx, episodes, top_k=4)
    plain = ctx.teacher.score([ep.ids[:1] for ep in episodes], [ep.ids[1:] for ep in episodes], top_k=4)
    for i, ep in enumerate(episodes):
        end, n = ep.spans[0][1], len(ep.ids) - 1
        got, want = scores.logprobs_B_T[i, end - 1 : n], plain.logprobs_B_T[i, end - 1 : n]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert torch.equal(scores.topk()[0][i, end - 1 : n], plain.topk()[0][i, end - 1 : n])


def test_opsd_every_turn_scores_each_token_where_it_sits_in_the_turned_view(
    registered: None, tiny_zoo: Any, tmp_path: Path
) -> None:
    """`method.privileged_every_turn`: the teacher reads the episode with the privileged context at
    the end of every user message; each student token's score is the one the teacher gives it in
    that view, read back where the token sits in the student's sequence."""
    from distill.methods.episode_online import _teacher_scores

    ctx = _context(tmp_path, tiny_zoo, every_turn=True)
    episodes = _episodes(ctx)
    scores = _teacher_scores(ctx, episodes, top_k=4)
    tok = ctx.student.tokenizer
    for i, ep in enumerate(episodes):
        secret = ctx.domain.privileged_context(ep.item).strip()
        view, where = ep.privileged_view(secret)
        assert tok.decode(view).count(secret) == tok.decode(view).count("<|im_start|>user") >= 2
        assert [view[w] for w in where] == ep.ids
        direct = ctx.teacher.score([view[:1]], [view[1:]], top_k=4)
        at = torch.tensor([w - 1 for w in where[1:]])
        n = len(ep.ids) - 1
        torch.testing.assert_close(scores.logprobs_B_T[i, :n], direct.logprobs_B_T[0, at])
        assert torch.equal(scores.topk()[0][i, :n], direct.topk()[0][0, at])
        assert scores.mask_B_T[i, :n].all() and not scores.mask_B_T[i, n:].any()
    plain = ctx.teacher.score([ep.ids[:1] for ep in episodes], [ep.ids[1:] for ep in episodes])
    turns_B_T = torch.zeros_like(plain.mask_B_T, dtype=torch.bool)
    for i, ep in enumerate(episodes):
        turns_B_T[i, : len(ep.ids) - 1] = torch.tensor(ep.mask({"student"})[1:], dtype=torch.bool)
    gap = (
        (scores.widened(plain.logprobs_B_T.shape[1]).logprobs_B_T - plain.logprobs_B_T)[turns_B_T].abs().max()
    )
    assert gap > 1e-4  # the context changes what the teacher expects on the student's turns


def test_each_process_gives_its_episodes_the_turns_one_process_would(monkeypatch) -> None:
    # Several processes split a step's episodes (process r plays the r-th of equal slices): each
    # episode's N (student turns before the teacher's) must be the one a single process draws for it.
    import random
    from types import SimpleNamespace

    from distill.config.methods import ROSEMethod
    from distill.methods.episode_online import micro_batch_seed, student_turns_for

    method = ROSEMethod(student_turns=6, student_turns_min=0)
    seed = micro_batch_seed(0, 3, 0)
    one = student_turns_for(method, random.Random(seed), 8)
    whole = [one(SimpleNamespace(position=i)) for i in range(8)]
    assert len(set(whole)) > 1  # the draws differ, so a slice in the wrong place shows
    split = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        mine = student_turns_for(method, random.Random(seed), 4)
        split += [mine(SimpleNamespace(position=i)) for i in range(4)]
    assert split == whole
