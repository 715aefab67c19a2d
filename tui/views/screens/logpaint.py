"""How the log viewer draws: each line styled by severity with search hits and the
current match, cut to the width or folded into rows, a line-number gutter, the page
filled from the top (or from the bottom, so the log's last line is the last row), and
the one-row status line. The navigation, workers and keys are in `logviewer.py`; this
base class holds only the state they share and the drawing, which the viewer asks for
by public names (`paint`, `render_status`, `rows_needed`, `index_done`)."""

from __future__ import annotations

import re

from rich.cells import cell_len, get_character_cell_size
from rich.text import Text
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Static

from tui.protocol.hosttext import clean
from tui.state.logpage.document import MATCH_MAX, Line, LogDocument
from tui.views.widgets.logtail import ERROR_PATTERN, style_line


class LogPainter(Screen[None]):
    """The drawing half of `LogViewerScreen`: reads the viewer's state, paints the body."""

    path: str
    doc: LogDocument
    follow: bool
    wrap: bool
    hscroll: int
    index_lines: bool
    pattern: re.Pattern[str] | None
    matches_only: bool
    errors_only: bool
    window: list[Line]
    top: int
    at_end: bool
    on_screen: list[Line]
    whole: int
    match: Line | None
    searching: float | None
    error: str | None

    def _body_size(self) -> tuple[int, int]:
        """The body's (width, height); once the screen is closing and the body is gone (a
        page fetch still in flight), the terminal's size, so the fetch ends quietly."""
        try:
            size = self.query_one("#lv-body").size
        except NoMatches:
            size = self.app.size
        return size.width or self.app.size.width, size.height

    @property
    def rows(self) -> int:
        """Rows the body shows: the page size."""
        return max(1, self._body_size()[1] or 20)

    def patterns(self) -> list[re.Pattern[str]]:
        """The active filters (AND-ed); empty when every line is shown."""
        pats = []
        if self.matches_only and self.pattern is not None:
            pats.append(self.pattern)
        if self.errors_only:
            pats.append(ERROR_PATTERN)
        return pats

    # ---- rendering -------------------------------------------------------------------
    def _styled(self, ln: Line) -> Text:
        """``ln`` coloured by severity, with search hits and the current match; tabs expanded."""
        text = ln.text
        # Only a line's head decides its colour and is searched for highlights: a regex run
        # over a 16k-character line could stall the UI (MATCH_MAX bounds the filters too).
        t = Text(text, style=style_line(text[:MATCH_MAX]).style, end="")
        if self.pattern is not None:
            lo = 0 if self.wrap else max(0, self.hscroll - MATCH_MAX // 2)
            for m in self.pattern.finditer(text, lo, lo + MATCH_MAX):
                if m.end() > m.start():
                    t.stylize("bold black on yellow", m.start(), m.end())
        if self.match is not None and ln.start == self.match.start:
            t.stylize("reverse")
        if "\t" in text:
            t.expand_tabs()
        return t

    def _rows_of(self, t: Text, width: int, limit: int) -> list[Text]:
        """``t`` as at most ``limit`` rows of ``width`` cells: cut to the width, or folded."""
        if not self.wrap:
            if self.hscroll:
                t = t[self.hscroll:] if self.hscroll < len(t.plain) else Text("", end="")
            if cell_len(t.plain) > width:
                t.truncate(width, overflow="ellipsis")  # "…" says the line goes on
            return [t]
        plain = t.plain
        cuts: list[int] = []
        if plain.isascii():
            cuts = list(range(width, len(plain), width))[:limit]
        else:
            used = 0
            for i, ch in enumerate(plain):
                w = get_character_cell_size(ch)
                if used + w > width and used:
                    cuts.append(i)
                    used = 0
                    if len(cuts) >= limit:
                        break
                used += w
        return list(t.divide(cuts))[:limit]

    def _gutter(self, lines: list[Line]) -> int:
        """Columns of the line-number gutter (0 while no number is known)."""
        known = [ln.line_no for ln in lines if ln.line_no is not None]
        return len(str(max(known))) if known else 0

    def _text_width(self, gutter: int) -> int:
        return max(1, self._body_size()[0] - (gutter + 1 if gutter else 0))

    def rows_needed(self, lines: list[Line]) -> int:
        """Rows ``lines`` take on screen (counted up to one page)."""
        if not self.wrap:
            return len(lines)
        width, total = self._text_width(self._gutter(lines)), 0
        for ln in lines:
            total += len(self._rows_of(Text(ln.text.expandtabs(8)), width, self.rows))
            if total >= self.rows:
                break
        return total

    def paint(self) -> None:
        try:
            body = self.query_one("#lv-body", Static)
        except NoMatches:  # a worker finishing while the screen is torn down
            return
        free = self.rows
        gutter = self._gutter(self.window)
        width = self._text_width(gutter)
        # Lines fill the body from the top, or from the bottom when the window was read back
        # from the end (so the log's last line is the last row). The line at the far edge
        # may not fit whole: its rows nearest the anchor are shown.
        blocks: list[tuple[Line, list[Text]]] = []
        used, self.whole = 0, 0
        for ln in reversed(self.window) if self.at_end else self.window:
            # From the bottom, a cut line shows its true end, so it is folded whole.
            rows = self._rows_of(self._styled(ln), width, 1 << 30 if self.at_end else free)
            if used + len(rows) > free:
                rows = rows[len(rows) - (free - used):] if self.at_end else rows[: free - used]
            else:
                self.whole += 1
            blocks.append((ln, rows))
            used += len(rows)
            if used >= free:
                break
        if self.at_end:
            blocks.reverse()
        self.on_screen = [ln for ln, _ in blocks]
        if self.at_end and self.on_screen:
            self.top = self.on_screen[0].start  # scrolling up goes on from what is on screen
        out = Text(no_wrap=True, overflow="crop", end="")
        for ln, rows in blocks:
            for k, row in enumerate(rows):
                if len(out):
                    out.append("\n")
                if gutter:
                    no = str(ln.line_no) if ln.line_no is not None and k == 0 else ""  # first row shown
                    out.append(no.rjust(gutter) + " ", style="dim")
                out.append_text(row)
        if not blocks:
            out.append("(no lines match)" if self.patterns() else "(empty)", style="dim")
        body.update(out)
        self.render_status()

    def render_status(self) -> None:
        """One row, most important first: flags, errors, position, size; the path gets the rest."""
        try:
            status = self.query_one("#lv-status", Static)
        except NoMatches:
            return
        width = status.size.width or self.app.size.width or 100
        size = self.doc.size
        pat = self.pattern.pattern if self.pattern else ""
        flags = [
            "FOLLOW" if self.follow else "",
            f"MATCHES /{pat if len(pat) <= 20 else pat[:19] + '…'}/" if self.matches_only and pat else "",
            "ERRORS" if self.errors_only else "",
            "WRAP" if self.wrap else "",
            f"col {self.hscroll + 1}" if self.hscroll and not self.wrap else "",
        ]
        parts = [f for f in flags if f]
        if self.error:
            parts.append(self.error)
        if self.searching is not None:
            parts.append(f"searching {int(self.searching * 100)}% (esc cancels)")
        shown = self.on_screen or self.window
        if shown:
            a, b = shown[0].line_no, shown[-1].line_no
            if a is not None and b is not None:
                parts.append(f"lines {a}-{b}" + (f" of {self.doc.index.lines}" if self.index_done() else ""))
            parts.append(f"{100 * shown[-1].end // max(1, size)}%")
        if self.searching is None and self.index_lines and not self.index_done():
            parts.append(f"indexing {100 * self.doc.index.frontier // max(1, size)}%")
        parts.append(f"{size / 1048576:.1f} MiB" if size >= 1048576 else f"{size} B")
        head = " · ".join(parts)
        room = width - cell_len(head) - 3
        path = clean(self.path, newline=False)  # the host's path, as the client may show it
        if room >= 12:  # else the path is left out: the flags matter more
            if cell_len(path) > room:
                path = "…" + path[-(room - 1):]
            head += " · " + path
        out = Text(head, no_wrap=True, end="")
        for f in flags:
            if f:
                out.highlight_words([f], style="bold")
        out.truncate(width, overflow="ellipsis")
        status.update(out)

    def index_done(self) -> bool:
        return self.doc.size > 0 and self.doc.index.frontier >= self.doc.size

    # ---- workers ---------------------------------------------------------------------
