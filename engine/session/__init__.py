"""The chat session: `ChatSession` (the conversation, preset choice, context window, one reply at a time, in
`chat_session`), its history (`history.ChatHistory`, which it holds: the store, the metrics log, stored chats),
editing and continuing (`editing`), and `Turn` (`turn`); the parts it uses: the preset choice (`preset_choice`),
the context window (`context_window`), a reply in one pass (`reply_run`) and its parts (`reply`), loading a model
(`loading`), attachments.

`from engine.session import ChatSession` is the front ends' one way in.
"""

from engine.session.chat_session import ChatSession

__all__ = ["ChatSession"]
