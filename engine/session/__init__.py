"""The chat session: `ChatSession` (the conversation, preset choice, context window, one reply at a time, in
`chat_session`), its history (`history`: the store, the metrics log, stored chats) and `Turn` (`turn`).

`from engine.session import ChatSession` is the front ends' one way in.
"""

from engine.session.chat_session import ChatSession

__all__ = ["ChatSession"]
