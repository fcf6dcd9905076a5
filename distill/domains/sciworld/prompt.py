"""The AgentGym SciWorld conversation: instruction, fixed first reply, Thought/Action turns.

The instruction (with its action list) and the assistant's fixed first reply are AgentGym's
`SciworldEnvClient.conversation_start`; the first observation is the task description, a newline
and the result of "look around" (AgentGym's reset). The action is what follows the last
`Action:`; a response without one gets the "Invalid Action" feedback and no simulator step.
"""

from __future__ import annotations

import json

_ACTIONS = [
    ("open/close OBJ", "open/close a container"),
    ("de/activate OBJ", "activate/deactivate a device"),
    ("connect OBJ to OBJ", "connect electrical components"),
    ("disconnect OBJ", "disconnect electrical components"),
    ("use OBJ [on OBJ]", "use a device/item"),
    ("look around", "describe the current room"),
    ("look at OBJ", "describe an object in detail"),
    ("look in OBJ", "describe a container's contents"),
    ("read OBJ", "read a note or book"),
    ("move OBJ to OBJ", "move an object to a container"),
    ("pick up OBJ", "move an object to the inventory"),
    ("put down OBJ", "drop an inventory item"),
    ("pour OBJ into OBJ", "pour a liquid into a container"),
    ("dunk OBJ into OBJ", "dunk a container into a liquid"),
    ("mix OBJ", "chemically mix a container"),
    ("go to LOC", "move to a new location"),
    ("eat OBJ", "eat a food"),
    ("flush OBJ", "flush a toilet"),
    ("focus on OBJ", "signal intent on a task object"),
    ("wait", "take no action for 10 iterations"),
    ("wait1", "take no action for 1 iteration"),
    ("task", "describe current task"),
    ("inventory", "list your inventory"),
]

INSTRUCTION = (
    "You are an agent for science world. Every round I will give you an observation, you have to "
    "respond an action based on the observation to finish the given task. Here are the actions you "
    "may take: "
    + json.dumps([{"action": a, "description": d} for a, d in _ACTIONS])
    + "\nYour response should use the following format:\nThought:\nyour thoughts.\n\nAction:\nyour next action"
)

FIRST_REPLY = "OK. I'll follow your instructions and try my best to solve the task."

INVALID_ACTION = (
    "Invalid Action. Your response should use the following format:\n"
    "Thought:\nyour thoughts.\n\nAction:\nyour next action"
)

# What the simulator answers to an action it did not carry out (scienceworld 1.2.3, live): one it
# cannot parse; one that names several objects ("open door" beside two doors: it lists them and
# asks for a number, no move taken); and anything but a number after that question (it answers
# this, and takes a move).
REFUSALS = (
    "No known action matches that input.",
    "Ambiguous request:",
    "Unknown action.",
)


def refused(observation: str) -> bool:
    """Whether the simulator's answer says the action was not carried out (an invalid action)."""
    return observation.lstrip().startswith(REFUSALS)


def first_observation(task_description: str, observation: str) -> str:
    return f"{task_description}\n{observation}"


def parse_action(response: str) -> str | None:
    """The action after the last `Action:` (its first non-empty line), or None when missing."""
    head, sep, tail = response.rpartition("Action:")
    if not sep:
        return None
    for line in tail.splitlines():
        action = line.strip()
        if action:
            return action
    return None


def action_end(response: str) -> int | None:
    """The end of the first complete action line (the first non-empty line after the first
    `Action:`, closed by a newline) when more than whitespace follows it; None otherwise."""
    start = response.find("Action:")
    if start < 0:
        return None
    pos = start + len("Action:")
    for line in response[pos:].splitlines(keepends=True):
        if line.strip():
            if line == line.rstrip("\r\n"):  # the action runs to the end of the response
                return None
            end = pos + len(line.rstrip())
            return end if response[end:].strip() else None
        pos += len(line)
    return None


def format_response(action: str, thought: str | None = None) -> str:
    """A response in the AgentGym format (used for gold trajectories)."""
    return f"Thought:\n{thought or 'I should ' + action + '.'}\n\nAction:\n{action}"
