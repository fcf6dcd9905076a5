"""The AgentGym conversation pieces: instruction, action parsing, chat frames, score handling."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.domains.sciworld import SciWorldDomain
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.prompt import (
    FIRST_REPLY,
    INSTRUCTION,
    action_end,
    format_response,
    parse_action,
)
from distill.episodes.episode import ChatFrame


def test_instruction_is_agentgym_format() -> None:
    assert INSTRUCTION.startswith("You are an agent for science world.")
    for action in ("open/close OBJ", "focus on OBJ", "go to LOC", "wait1", "inventory"):
        assert f'"action": "{action}"' in INSTRUCTION
    assert INSTRUCTION.endswith("Thought:\nyour thoughts.\n\nAction:\nyour next action")
    assert FIRST_REPLY == "OK. I'll follow your instructions and try my best to solve the task."


@pytest.mark.parametrize(
    ("response", "action"),
    [
        ("Thought:\nI need the door.\n\nAction:\nopen door to kitchen", "open door to kitchen"),
        ("Action: go to kitchen", "go to kitchen"),
        ("Thought: x\nAction:\n\n  focus on dove  \nmore text", "focus on dove"),
        ("Action: look around\nThought: no\nAction: go to hallway", "go to hallway"),
        ("Thought: I will look around", None),
        ("Action:\n   \n", None),
        ("", None),
    ],
)
def test_parse_action(response: str, action: str | None) -> None:
    assert parse_action(response) == action


def test_format_response_round_trips() -> None:
    assert parse_action(format_response("move egg to orange box")) == "move egg to orange box"


def test_reward_handles_negative_scores() -> None:
    zero = SciWorldDomain(SciWorldDomainConfig())
    keep = SciWorldDomain(SciWorldDomainConfig(negative_score="keep"))
    assert zero.reward(100) == 1.0 and zero.solved(100) and not zero.solved(99)
    assert zero.reward(42) == 0.42
    assert zero.reward(-100) == 0.0
    assert keep.reward(-100) == -1.0


@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_chat_frame_rebuilds_the_template(family: str, tokenizer_dirs: dict[str, Path]) -> None:
    """Concatenating the frame's pieces reproduces the tokenizer's own rendering of a chat."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dirs[family])
    frame = ChatFrame.of(tok)
    messages = [
        {"role": "user", "content": "task one"},
        {"role": "assistant", "content": "Action: look"},
        {"role": "user", "content": "a room"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    built = frame.head + "task one" + frame.gen + "Action: look" + frame.between + "a room" + frame.gen
    assert built == rendered
    assert frame.eos_text == tok.eos_token
    assert frame.between.startswith(tok.eos_token)


@pytest.mark.parametrize("method", ["sft", "rose", "opd"])
def test_presets_resolve(method: str) -> None:
    from distill.config import resolve_config

    cfg = resolve_config("sciworld", method)
    assert cfg.domain.name == "sciworld" and cfg.method.name == method
    assert cfg.domain.max_turns == 20 and cfg.domain.pool_size >= 1  # type: ignore[union-attr]


def test_bad_domain_fields_are_named() -> None:
    from distill.config import ConfigError, domain_config, resolve_config

    with pytest.raises(ConfigError, match="domain.java_heap"):
        resolve_config("sciworld", "sft", overrides=["domain.java_heap=lots"])
    with pytest.raises(ConfigError, match="domain.pool_size"):
        domain_config("sciworld", pool_size=0)
    from distill.domains import build_domain

    with pytest.raises(ValueError, match="domain.tasks: unknown ScienceWorld task id '99-1'"):
        build_domain(domain_config("sciworld", tasks=["99-1"]))


@pytest.mark.parametrize(
    ("response", "kept"),
    [
        (
            "Thought:\nx.\n\nAction:\ngo to kitchen\nYou move to the kitchen.",
            "Thought:\nx.\n\nAction:\ngo to kitchen",
        ),
        ("Action: look around  \nThought: again\nAction: wait", "Action: look around"),
        ("Thought:\nx.\n\nAction:\n\n focus on dove \n\nmore", "Thought:\nx.\n\nAction:\n\n focus on dove"),
        ("Thought:\nx.\n\nAction:\ngo to kitchen", None),  # nothing after the action
        ("Thought:\nx.\n\nAction:\ngo to kitchen\n\n", None),  # only whitespace after it
        ("Thought:\nno action yet\nmore thought", None),
        ("Action:\n\n", None),
    ],
)
def test_action_end_cuts_after_the_first_action_line(response: str, kept: str | None) -> None:
    end = action_end(response)
    assert (None if end is None else response[:end]) == kept
    if kept is not None:  # the cut turn takes the action its first action line names
        assert parse_action(kept) == kept.rsplit("\n", 1)[-1].removeprefix("Action:").strip()


def test_stop_at_action_is_the_domains_turn_end() -> None:
    text = "Action:\ngo to kitchen\nThe door is open."
    assert SciWorldDomain(SciWorldDomainConfig()).turn_end(text) == len("Action:\ngo to kitchen")
    assert SciWorldDomain(SciWorldDomainConfig(stop_at_action=False)).turn_end(text) is None
