"""A gold-action episode through the real ScienceWorld simulator, its token sequence and masks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from distill.domains.sciworld import SciWorldDomain, item_of
from distill.domains.sciworld.index import IndexEntry
from distill.domains.sciworld.prompt import FIRST_REPLY, INSTRUCTION, format_response
from distill.episodes.episode import ENV, FIXED, ChatFrame
from distill.episodes.play import handover, play

from .conftest import gold

pytestmark = pytest.mark.integration

STUDENT_TURNS = 2


def find_non_living(variation: int) -> IndexEntry:
    # The index number only names the item here; the simulator is addressed by task and variation.
    return IndexEntry(index=variation, task_id="4-2", task_name="find-non-living-thing", variation=variation)


@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_gold_episode_mask_turn_by_turn(
    family: str, sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """ROSE split on a gold episode: env tokens 0, student turns 0, teacher turns 1, score 100."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs[family])
    frame = ChatFrame.of(tok)
    item = item_of(find_non_living(7))
    policy = handover(gold("student"), gold("teacher"), STUDENT_TURNS)
    (ep,) = play(sw_domain, [item], policy, tok, frame, gold=True, max_turns=20)

    assert ep.error is None
    assert ep.done and ep.score == 100
    assert ep.gold is not None and len(ep.turns) == len(ep.gold) > STUDENT_TURNS
    assert [t.action for t in ep.turns] == ep.gold
    # spans tile the sequence exactly
    assert ep.spans[0][0] == 0 and ep.spans[-1][1] == len(ep.ids)
    assert all(a[1] == b[0] for a, b in zip(ep.spans, ep.spans[1:], strict=False))

    mask = ep.mask({"teacher"})
    assert len(mask) == len(ep.ids)
    turns = ep.turn_spans()
    assert [w for _, _, w in turns] == ["student"] * STUDENT_TURNS + ["teacher"] * (
        len(ep.turns) - STUDENT_TURNS
    )
    for (start, end, writer), turn in zip(turns, ep.turns, strict=True):
        expected = 1 if writer == "teacher" else 0
        assert mask[start:end] == [expected] * (end - start), f"turn {turn.action!r} by {writer}"
        # the turn's tokens are exactly what its writer produced, ending with EOS
        assert ep.ids[end - 1] == tok.eos_token_id
        assert tok.decode(ep.ids[start:end], skip_special_tokens=True) == format_response(turn.action)
    for start, end, writer in ep.spans:
        if writer in (ENV, FIXED):
            assert set(mask[start:end]) == {0}, f"{writer} tokens must be mask 0"
    assert sum(mask) == sum(e - s for s, e, w in turns if w == "teacher") > 0
    # under OPD-style selection the student turns are the ones marked
    student_mask = ep.mask({"student"})
    assert sum(student_mask) == sum(e - s for s, e, w in turns if w == "student")
    assert not any(m and s for m, s in zip(mask, student_mask, strict=True))

    # The concatenated sequence is the tokenizer's own rendering of the AgentGym conversation.
    messages = [
        {"role": "user", "content": INSTRUCTION},
        {"role": "assistant", "content": FIRST_REPLY},
        {"role": "user", "content": ep.first_observation},
    ]
    for i, turn in enumerate(ep.turns):
        messages.append({"role": "assistant", "content": turn.response})
        if i + 1 < len(ep.turns):
            messages.append({"role": "user", "content": turn.observation})
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered.startswith(tok.decode(ep.ids))
    assert "Your task is to find a(n) non-living thing" in ep.first_observation
    # the last observation is recorded but not tokenised (no turn follows it)
    assert ep.turns[-1].observation and ep.turns[-1].observation not in tok.decode(ep.ids)


def test_invalid_action_feedback_and_turn_limit(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """A response without `Action:` gets the Invalid Action feedback, no simulator step; the turn
    limit ends the episode; an unknown action counts as invalid too."""
    from transformers import AutoTokenizer

    from distill.engines.base import Completion

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])

    class Scripted:
        writer = "student"
        texts = ["I am thinking", "Action: fly to the moon", "Action: look around"]

        def act(self, episodes):  # type: ignore[no-untyped-def]  # a scripted test agent
            out = []
            for ep in episodes:
                text = self.texts[len(ep.turns)]
                ids = tok(text, add_special_tokens=False)["input_ids"][:64]
                out.append(Completion(ids=ids, text=text, truncated=True))
            return out

    item = item_of(find_non_living(3))
    (ep,) = play(sw_domain, [item], lambda ep: Scripted(), tok, ChatFrame.of(tok), max_turns=3)
    assert ep.error is None and not ep.done
    assert len(ep.turns) == 3
    assert [t.valid for t in ep.turns] == [False, False, True]
    assert ep.turns[0].observation.startswith("Invalid Action")
    assert ep.turns[1].observation.startswith("No known action matches that input.")
    assert "Invalid Action" in tok.decode(ep.ids)
    assert ep.record(sw_domain)["invalid_actions"] == 2 and ep.record(sw_domain)["truncated_turns"] == 3


def test_recorded_gold_replays_to_the_live_sequence(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """Training rows built offline from an item's recorded gold steps are token for token the
    sequence a live gold episode produces, with labels exactly on the gold turns."""
    from transformers import AutoTokenizer

    from distill.domains.sciworld.config import SciWorldDomainConfig
    from distill.episodes.data import IGNORE, episode_example, replay_gold

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])
    frame = ChatFrame.of(tok, enable_thinking=False)
    domain = SciWorldDomain(
        SciWorldDomainConfig(tasks=["4-2"], train_size=1, eval_size=1), pool=sw_domain.pool()
    )
    (item,) = domain.train_items()
    (live,) = play(domain, [item], lambda ep: gold(), tok, frame, gold=True)
    # Two plays of one variation can differ (the simulator draws its gold path and the world
    # ticks), so the offline rows are rebuilt from this play's record.
    steps = [{"action": t.action, "observation": t.observation} for t in live.turns]
    recorded = replace(item, meta={**item.meta, "first": live.first_observation, "steps": steps})
    offline = replay_gold(recorded, domain, tok, frame)
    assert live.score == offline.score == 100
    assert offline.ids == live.ids and offline.spans == live.spans
    ids, labels = episode_example(offline, ["gold"])
    assert ids == offline.ids
    gold_tokens = sum(e - s for s, e, w in offline.spans if w == "gold")
    assert sum(label != IGNORE for label in labels) == gold_tokens
    assert "<think>\n\n</think>" in tok.decode(ids)  # thinking off: the empty think block, every turn


def test_look_before_focus_only_after_a_move() -> None:
    from distill.domains.sciworld import look_before_focus

    gold = ["open door to outside", "go to outside", "focus on crocodile", "focus on ant", "wait1"]
    assert look_before_focus(gold) == [
        "open door to outside",
        "go to outside",
        "look around",
        "focus on crocodile",
        "focus on ant",
        "wait1",
    ]
    # Already looked, or focusing from the start room (whose look is the first observation).
    assert look_before_focus(["go to bathroom", "look around", "focus on cup"]) == [
        "go to bathroom",
        "look around",
        "focus on cup",
    ]
    assert look_before_focus(["focus on cup", "move cup to red box"]) == [
        "focus on cup",
        "move cup to red box",
    ]


def test_gold_with_look_names_the_animal_and_still_succeeds(sw_domain: SciWorldDomain) -> None:
    """Lifespan gold paths focus on an animal right after walking outside; with the inserted
    look the animal is named in the observation before it, and the episode still scores 100."""
    entry = IndexEntry(index=0, task_id="7-1", task_name="lifespan-longest-lived", variation=24)
    (plain,) = play(sw_domain, [item_of(entry)], lambda ep: gold(), None, None, gold=True)
    looked_agent = gold(look=True)
    (looked,) = play(sw_domain, [item_of(entry)], lambda ep: looked_agent, None, None, gold=True)
    assert plain.score == looked.score == 100
    actions = [t.action for t in looked.turns]
    assert len(actions) == len(plain.turns) + 1
    focus = next(i for i, a in enumerate(actions) if a.startswith("focus on"))
    assert actions[focus - 1] == "look around" and actions[focus - 2].startswith("go to")
    animal = actions[focus].removeprefix("focus on ").split()[-1]
    assert animal in looked.turns[focus - 1].observation
    assert animal not in plain.turns[focus - 2].observation  # "You move to the outside."


def test_an_episode_without_a_simulator_step_keeps_the_initial_score(sw_domain: SciWorldDomain) -> None:
    """Variation 107 of 7-1 starts at 50 (partial credit before any action): an agent that never
    writes a parseable action ends there, not at 0."""
    from distill.engines.base import Completion

    class Mute:
        writer = "student"

        def act(self, episodes):  # type: ignore[no-untyped-def]  # a scripted test agent
            return [Completion(ids=[], text="I am thinking", truncated=True) for _ in episodes]

    entry = IndexEntry(index=0, task_id="7-1", task_name="lifespan-longest-lived", variation=107)
    (ep,) = play(sw_domain, [item_of(entry)], lambda ep: Mute(), None, None, max_turns=2)
    assert [t.valid for t in ep.turns] == [False, False]
    assert ep.moves == 0 and ep.score == 50


def test_a_long_gold_path_replays_to_the_simulators_own_final_score(sw_domain: SciWorldDomain) -> None:
    """9-3 variation 0 has 178 gold actions, past the simulator's 100-move limit (and the inserted
    looks add turns). ScienceWorld's own replay, env.step through its gold sequence, ends at
    100: `with_gold` must play the whole script and reach the same score."""
    from scienceworld import ScienceWorldEnv

    from distill.domains.sciworld import look_before_focus

    task = "inclined-plane-friction-unnamed-surfaces"
    (item,) = sw_domain.with_gold([item_of(IndexEntry(index=0, task_id="9-3", task_name=task, variation=0))])
    env = ScienceWorldEnv("", envStepLimit=100)
    try:
        env.load(task, 0, "", generateGoldPath=True)
        gold = list(env.get_gold_action_sequence())
        for action in gold:
            _, _, _, info = env.step(action)
        direct = int(info["score"])
    finally:
        env.close()
    played = [step["action"] for step in item.meta["steps"]]
    script = look_before_focus(gold)
    # Played past the move limit, the whole script, to where the task completed (the simulator
    # completes 9-3 before the script's trailing "wait1"). The two loads may name the unnamed
    # surfaces differently (the gold path is drawn per load), so the scripts match in length and
    # in their fixed opening, not word for word.
    assert len(gold) > 100 and len(played) > 100
    assert played[:4] == script[:4] and 0 <= len(script) - len(played) <= 1
    assert item.meta["gold_score"] == direct == 100


def test_detour_episodes_answer_each_mistake_from_the_simulator_and_keep_only_gold_scores(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A detour ("go to kitchen" before its door is open, twice) is played through the simulator:
    the mistaken turns are SLIP's and answered by the simulator ("The door is not open."), the
    gold play goes on to the gold score, and no label falls on a mistaken turn. A play that does
    not reach the gold score (here: a gold step left out) is dropped."""
    from transformers import AutoTokenizer

    from distill.episodes.data import IGNORE, SLIP
    from distill.zoo import detours
    from distill.zoo.episodes import _labelled

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])
    (item,) = sw_domain.with_gold([item_of(find_non_living(7))])
    actions = [str(s["action"]) for s in item.meta["steps"]]
    assert actions[:2] == ["open door to kitchen", "go to kitchen"]
    plans = {
        "detour": (["go to kitchen"] * 2 + actions, {0, 1}),
        "broken": (actions[:2] + actions[3:], set()),
    }
    for name, plan in plans.items():
        monkeypatch.setattr(detours, "detour_plan", lambda actions, rng, plan=plan: plan)
        kept = detours.detour_episodes([item], sw_domain, tok, share=1.0)
        if name == "broken":
            assert kept == []
            continue
        (ep,) = kept
        assert [t.action for t in ep.turns] == plan[0]
        assert [t.writer for t in ep.turns] == [SLIP, SLIP] + ["gold"] * len(actions)
        assert [t.observation for t in ep.turns[:2]] == ["The door is not open."] * 2
        assert ep.score == item.meta["gold_score"] == 100
        spans = ep.turn_spans()
        for loss in ("turns", "all"):
            _, labels = _labelled(ep, loss)
            assert all(labels[k] == IGNORE for s, e, w in spans if w == SLIP for k in range(s, e))
            assert all(labels[k] != IGNORE for s, e, w in spans if w == "gold" for k in range(s, e))


def test_a_detour_recipe_adds_its_played_detours_to_the_gold_rows(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """`detour_share` in a zoo recipe: the gold rows, then one detour row per kept detour play,
    each with more turns than its gold play and its mistaken turns unlabelled."""
    from transformers import AutoTokenizer

    from distill.domains.sciworld.config import SciWorldDomainConfig
    from distill.episodes.data import IGNORE
    from distill.zoo.episodes import agent_examples
    from distill.zoo.recipes import teacher_shape

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])
    domain = SciWorldDomain(
        SciWorldDomainConfig(tasks=["4-2"], train_size=3, eval_size=1), pool=sw_domain.pool()
    )
    shape = dict(steps=1, lr=1e-3, batch_size=2, episode_loss="all", max_positions=4096)
    plain, _, plain_extra = agent_examples(domain, "t", teacher_shape(**shape), tok)
    rows, _, extra = agent_examples(domain, "t", teacher_shape(**shape, detour_share=1.0), tok)
    assert "detour_episodes" not in plain_extra and len(plain) == 3
    assert rows[:3] == plain
    assert 1 <= extra["detour_episodes"] == len(rows) - 3 <= 3

    def shared(a: list[int], b: list[int]) -> int:
        return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    for ids, labels in rows[3:]:
        # Its own item's gold row: the one its first message (and gold turns up to the detour) shares.
        gold_ids, gold_labels = max(plain, key=lambda row: shared(ids, row[0]))
        assert len(ids) > len(gold_ids)
        assert sum(label == IGNORE for label in labels) > sum(label == IGNORE for label in gold_labels)


def test_ambiguous_and_unknown_actions_count_as_invalid(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """On the live simulator, "open door" beside several doors is answered with a numbered list
    (no move); anything but a number after it is "Unknown action." (a move taken). Neither action
    was carried out; the number that answers the question is."""
    from transformers import AutoTokenizer

    from distill.engines.base import Completion

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])
    actions = ["open door", "look around", "open door", "0", "look around"]

    class Scripted:
        writer = "student"

        def act(self, episodes):  # type: ignore[no-untyped-def]  # a scripted test agent
            texts = [f"Thought: go.\n\nAction: {actions[len(ep.turns)]}" for ep in episodes]
            return [
                Completion(ids=tok(t, add_special_tokens=False)["input_ids"], text=t, truncated=False)
                for t in texts
            ]

    # Boil water, variation 0: the agent starts in the hallway, between several doors.
    item = item_of(IndexEntry(index=0, task_id="1-1", task_name="boil", variation=0))
    (ep,) = play(sw_domain, [item], lambda ep: Scripted(), tok, ChatFrame.of(tok), max_turns=len(actions))
    assert ep.error is None and [t.action for t in ep.turns] == actions
    observations = [t.observation for t in ep.turns]
    assert observations[0].startswith("Ambiguous request:") and observations[1].startswith("Unknown action.")
    assert observations[3] == "The door is now open."
    assert [t.valid for t in ep.turns] == [False, False, False, True, True]
    assert ep.record(sw_domain)["invalid_actions"] == 3
