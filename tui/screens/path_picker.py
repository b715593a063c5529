"""Pick a model folder or a .gguf file from a folder tree (opened from the settings dialog's model and draft fields).

Enter opens a folder (or picks a file), ctrl+s picks the highlighted folder or file, backspace goes up one folder.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Static

from tui.keymap import PICKER_KEYS, bindings
from tui.widgets.footer import FittingFooter


def start_folder(text: str) -> Path:
    """Where the tree opens: the folder holding the path in the field (so its siblings show), else home."""
    path = Path(text).expanduser() if text.strip() else None
    if path is not None and path.exists():
        return path.parent if path.parent != path else path
    if path is not None and path.parent.is_dir():
        return path.parent
    return Path.home()


class PathPickerScreen(ModalScreen[str | None]):
    """Dismisses with the picked path, None on escape."""

    BINDINGS = bindings(PICKER_KEYS)

    def __init__(self, title: str, start: Path) -> None:
        super().__init__()
        self.title_text = title
        self.start = start

    def compose(self) -> ComposeResult:
        with Vertical(id="path-picker", classes="dialog"):
            yield Static(Text(self.title_text, style="bold"), classes="title")
            yield Static(str(self.start), id="path-picker-folder")
            yield DirectoryTree(self.start, id="path-picker-tree")
            yield Static("enter open · ctrl+s pick · backspace up · esc back", classes="hint")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one(DirectoryTree).focus()

    @property
    def tree(self) -> DirectoryTree:
        return self.query_one(DirectoryTree)

    def highlighted(self) -> Path | None:
        node = self.tree.cursor_node
        if node is None or node.data is None:
            return None
        return Path(node.data.path)

    def action_pick(self) -> None:
        path = self.highlighted()
        if path is not None:
            self.dismiss(str(path))

    def action_up(self) -> None:
        current = Path(self.tree.path)
        if current.parent != current:
            self.tree.path = current.parent
            self.query_one("#path-picker-folder", Static).update(str(current.parent))

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        self.dismiss(str(event.path))
