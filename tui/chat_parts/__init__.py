"""The chat screen's parts (`tui.screens.chat.ChatScreen` owns one of each): plain objects, each with a narrow
interface, that hold one concern's state and do its work on the screen's widgets."""
