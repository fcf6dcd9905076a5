"""The embedded agents of episodic domains: CE on the gold turns, or on every token of the episode
(SciWorld's recorded gold episodes; no simulator is started)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from distill.domains.base import Item
from distill.domains.sciworld import SciWorldDomain
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.episodes.data import IGNORE, replay_gold
from distill.episodes.episode import frame_for
from distill.zoo.episodes import agent_examples, privileged_examples, training_examples

SW = SciWorldDomain(SciWorldDomainConfig())

# A 4-2 gold trajectory in the simulator's words (variation 198, its look-around shortened).
STEPS = [
    ("open door to hallway", "The door is now open."),
    ("go to hallway", "You move to the hallway."),
    ("open door to bedroom", "The door is now open."),
    ("go to bedroom", "You move to the bedroom."),
    ("look around", "This room is called the bedroom. In it, you see: \n\tthe agent\n\ta bed\n\ta red box"),
    ("focus on bed", "You focus on the bed."),
    ("move bed to red box", "You move the bed to the red box."),
]
FIRST = (
    "Your task is to find a(n) non-living thing. First, focus on the thing. Then, move it to the red box "
    "in the bedroom.\nThis room is called the living room. In it, you see: \n\tthe agent\n\ta chair"
)


@pytest.fixture
def item() -> Item:
    steps = [{"action": a, "observation": o} for a, o in STEPS]
    meta = {"task_id": "4-2", "first": FIRST, "steps": steps, "gold_score": 100}
    return Item(id="sciworld_3434", prompt=FIRST, answer="100", solution=json.dumps(steps), meta=meta)


def test_turns_and_all_label_the_same_episode_differently(item: Item, tiny_zoo: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    ((ids, turn_labels),) = training_examples([item], SW, tok, "turns")
    ((all_ids, all_labels),) = training_examples([item], SW, tok, "all")
    assert ids == all_ids
    assert all_labels == ids  # every token, the observations' echoes of the actions included
    ep = replay_gold(item, SW, tok, frame_for(tok, None))
    assert ep.ids == ids
    labelled = [i for i, label in enumerate(turn_labels) if label != IGNORE]
    assert labelled == [i for i, m in enumerate(ep.mask({"gold"})) if m]
    assert all(turn_labels[i] == ids[i] for i in labelled)
    # The gold turns are a small part of the sequence; the rest is what "all" adds.
    assert 0 < len(labelled) < len(ids) // 2
    unlabelled = tok.decode([t for t, label in zip(ids, turn_labels, strict=True) if label == IGNORE])
    assert "You focus on the bed." in unlabelled
    assert "You focus on" not in tok.decode([ids[i] for i in labelled])
    with pytest.raises(ValueError, match="episode_loss='env'"):
        training_examples([item], SW, tok, "env")


def test_corrupt_prob_inserts_one_unlabelled_slip_answered_by_invalid_action(
    item: Item, tiny_zoo: Any
) -> None:
    from transformers import AutoTokenizer

    from distill.domains.sciworld.prompt import INVALID_ACTION

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    ((plain_ids, _),) = training_examples([item], SW, tok, "all")
    assert training_examples([item], SW, tok, "all", 0.0, 3) == [(plain_ids, plain_ids)]
    for seed in range(4):
        ((ids, labels),) = training_examples([item], SW, tok, "all", 1.0, seed)
        unlabelled = [i for i, label in enumerate(labels) if label == IGNORE]
        # One contiguous malformed turn: a gold thought cut short, ending its turn, no action.
        assert unlabelled == list(range(unlabelled[0], unlabelled[-1] + 1))
        slip = tok.decode([ids[i] for i in unlabelled])
        assert slip.startswith("Thought:\nI") and slip.endswith(tok.eos_token) and "Action:" not in slip
        assert all(labels[i] == ids[i] for i in range(len(ids)) if i not in unlabelled)
        text = tok.decode(ids)
        assert text.count(INVALID_ACTION) == 1 and text.index(slip) < text.index(INVALID_ACTION)
        # Every gold turn is still there, in order: the slip adds a turn, it replaces none.
        assert len(ids) > len(plain_ids)
        ((_, turn_labels),) = training_examples([item], SW, tok, "turns", 1.0, seed)
        gold = tok.decode([t for t in turn_labels if t != IGNORE]).replace(tok.eos_token, "\n")
        assert [a for a, _ in STEPS] == [line for line in gold.split("\n") if line in {a for a, _ in STEPS}]


@pytest.mark.parametrize("loss", ["turns", "all"])
def test_episodes_share_their_instruction_and_train_on_it_once(item: Item, tiny_zoo: Any, loss: str) -> None:
    """`share_prefix`: gold episodes start with the same instruction and action list; running it
    once gives the padded rows' loss and gradients on real episodes, corrupted ones included."""
    import torch
    from transformers import AutoTokenizer

    from distill.zoo.batches import common_prefix_length, padded_batch, shared_prefix_loss
    from distill.zoo.build import make_model
    from distill.zoo.recipes import student_shape

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    other_first = FIRST.replace("non-living thing", "living thing").replace("red box", "green box")
    other = Item(id="sciworld_9", prompt=other_first, answer="100", solution=item.solution,
                 meta={**item.meta, "first": other_first})  # fmt: skip
    batch = training_examples([item, other, item], SW, tok, loss, corrupt_prob=0.5, seed=3)
    width = common_prefix_length(batch)
    assert "Here are the actions you may take" in tok.decode(batch[0][0][:width])
    assert "non-living" not in tok.decode(batch[0][0][:width])
    torch.manual_seed(0)
    model = make_model(student_shape(steps=1, lr=1e-3, batch_size=3, max_positions=4096), tok)
    results = []
    for loss_of in (
        lambda: model(**padded_batch(batch, tok.pad_token_id), use_cache=False).loss,
        lambda: shared_prefix_loss(model, batch, tok.pad_token_id),
    ):
        model.zero_grad()
        value = loss_of()
        value.backward()
        results.append((value.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_privileged_examples_put_the_gold_plan_in_the_first_message_only(item: Item, tiny_zoo: Any) -> None:
    """OPSD's student (`privileged_share`): the gold episode again with its first user message in
    OPSD's template around the gold plan, the very view OPSD's teacher scores from at run time;
    every later token and label the plain episode's, the rewritten start unlabelled."""
    from transformers import AutoTokenizer

    from distill.config import OPSDMethod
    from distill.methods.views import teacher_message

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    ((ids, labels),) = training_examples([item], SW, tok, "turns")
    ((view_ids, view_labels),) = privileged_examples([item], SW, tok, "turns", 1.0)
    ep = replay_gold(item, SW, tok, frame_for(tok, None))
    start, _ = ep.privileged_prompt(teacher_message(OPSDMethod(), SW, item, ep.first_message))
    end = ep.spans[0][1]
    assert view_ids == start + ids[end:]
    assert view_labels == [IGNORE] * len(start) + labels[end:]
    plan = "A plan that solves this task: open door to hallway; go to hallway;"
    assert plan in tok.decode(start) and "Reference Solution Begin" in tok.decode(start)
    assert "A plan" not in tok.decode(ids)
    # The share is drawn per item from the seed's own stream.
    many = [dataclasses.replace(item, id=f"sciworld_{i}") for i in range(40)]
    half = privileged_examples(many, SW, tok, "turns", 0.5, seed=1)
    assert 8 < len(half) < 32 and half == privileged_examples(many, SW, tok, "turns", 0.5, seed=1)
    assert privileged_examples(many, SW, tok, "turns", 0.0) == []


def test_privileged_examples_every_turn_end_every_user_message_with_the_plan(
    item: Item, tiny_zoo: Any
) -> None:
    """`every_turn` (the zoo view of OPSD's `method.privileged_every_turn`): the gold plan at the
    end of every user message, before its assistant header; every other token and label the
    plain episode's, in order, the inserted ones unlabelled."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    ((ids, labels),) = training_examples([item], SW, tok, "turns")
    ((view, view_labels),) = privileged_examples([item], SW, tok, "turns", 1.0, every_turn=True)
    ep = replay_gold(item, SW, tok, frame_for(tok, None))
    turned, where = ep.privileged_view(SW.privileged_context(item))
    assert view == turned and len(where) == len(ids) and where == sorted(set(where))
    assert [view[w] for w in where] == ids and [view_labels[w] for w in where] == labels
    inserted = [i for i in range(len(view)) if i not in set(where)]
    assert inserted and all(view_labels[i] == IGNORE for i in inserted)
    plan = SW.privileged_context(item)
    text = tok.decode(view)
    user_messages = text.count("<|im_start|>user")
    assert text.count(plan) == user_messages > 2 and plan not in tok.decode(ids)
    # Each copy sits right before its message's end: the assistant header follows it.
    assert text.count(plan + "<|im_end|>\n<|im_start|>assistant") == user_messages


class _Recorded(SciWorldDomain):
    """SciWorld with the fixture's recorded gold episodes as its training items (no simulator)."""

    def __init__(self, items: list[Item]) -> None:
        super().__init__(SciWorldDomainConfig())
        self._recorded = items

    def train_items(self) -> list[Item]:
        return self._recorded


def test_a_privileged_recipe_adds_the_plan_view_of_its_pool_to_the_plain_slice(
    item: Item, tiny_zoo: Any
) -> None:
    """zoo:student-privileged on an episodic domain: the student's plain slice (at most an eighth
    of the episodes), plus the privileged view of the first `privileged_items` episodes."""
    from transformers import AutoTokenizer

    from distill.zoo.recipes import student_shape

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    steps = item.meta["steps"]
    many = [
        dataclasses.replace(item, id=f"sciworld_{i}", meta={**item.meta, "steps": steps[: 2 + i % 5]})
        for i in range(48)
    ]
    domain = _Recorded(many)
    recipe = student_shape(steps=1, lr=1e-3, batch_size=4, data_items=32, max_positions=4096)
    plain, _, extra = agent_examples(domain, "student", recipe, tok)
    assert plain == training_examples(many[:6], SW, tok, "turns") and "privileged_episodes" not in extra
    wide = recipe.model_copy(update={"privileged_share": 1.0, "privileged_items": 20})
    both, _, extra = agent_examples(domain, "student-privileged", wide, tok)
    assert both[:6] == plain and extra["privileged_episodes"] == 20
    assert both[6:] == privileged_examples(many[:20], SW, tok, "turns", 1.0)
    # Without `privileged_items` the plan view covers the plain slice only.
    own, _, _ = agent_examples(domain, "s", wide.model_copy(update={"privileged_items": None}), tok)
    assert own[6:] == privileged_examples(many[:6], SW, tok, "turns", 1.0)
