"""Chat messages as the OpenAI API and vLLM take them, reduced to what a chat template reads."""
from __future__ import annotations

from typing import Any


def content_text(content: Any) -> str:
    """A message's content as text: a string, None (empty), or a list of text parts
    (``{"type": "text", "text": ...}``, joined by newlines). ValueError for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ValueError("content parts must be {\"type\": \"text\", \"text\": str}: "
                                 "only text is supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError("content must be a string or a list of text parts")


def normalize_conversation(messages: Any) -> list[dict[str, str]]:
    """Messages ({"role", "content", optional "name"}) with their content as text."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a conversation must be a non-empty list of messages")
    conversation = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message must be a dict with a string 'role' and a 'content' "
                             "(a string or a list of text parts)")
        message = {"role": m["role"], "content": content_text(m.get("content"))}
        if isinstance(m.get("name"), str):
            message["name"] = m["name"]
        conversation.append(message)
    return conversation
