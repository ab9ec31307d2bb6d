//! Splitting generated text into plain text and tool calls as it arrives. Text streams on
//! until a call's opening marker shows up (a possible start of one is held back until the
//! next text settles it); the call is held until its closing marker, then reported whole.
//! A call that does not parse goes out as the text the model wrote.

use super::tool_calls::{ToolCall, ToolSyntax};

/// One piece of the output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// A call and its index among the calls of the output.
    Call(usize, ToolCall),
}

#[derive(Debug)]
pub struct ToolStream {
    syntax: ToolSyntax,
    /// Whether more than one call is reported (OpenAI's `parallel_tool_calls`); without,
    /// calls after the first are dropped.
    parallel: bool,
    /// Inside a call: its text so far; else the text held back as a possible marker start.
    held: String,
    in_call: bool,
    /// Whitespace after a call, dropped if only another call or the end follows it.
    gap: String,
    calls: usize,
}

impl ToolStream {
    pub fn new(syntax: ToolSyntax, parallel: bool) -> Self {
        Self {
            syntax,
            parallel,
            held: String::new(),
            in_call: false,
            gap: String::new(),
            calls: 0,
        }
    }

    /// Calls reported so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut pieces = Vec::new();
        loop {
            if self.in_call {
                let close = self.syntax.close();
                let Some(end) = self.held.find(close) else {
                    break;
                };
                let rest = self.held.split_off(end + close.len());
                let mut body = std::mem::replace(&mut self.held, rest);
                body.truncate(end);
                self.in_call = false;
                self.call(&body, true, &mut pieces);
            } else {
                let open = self.syntax.open();
                match self.held.find(open) {
                    Some(start) => {
                        let rest = self.held.split_off(start + open.len());
                        let mut before = std::mem::replace(&mut self.held, rest);
                        before.truncate(start);
                        self.text(before, true, &mut pieces);
                        self.in_call = true;
                    }
                    None => {
                        let keep = partial_marker(&self.held, open);
                        let rest = self.held.split_off(self.held.len() - keep);
                        let settled = std::mem::replace(&mut self.held, rest);
                        self.text(settled, false, &mut pieces);
                        break;
                    }
                }
            }
        }
        pieces
    }

    /// The pieces left at the end: held text, and an unclosed call (the output stopped at
    /// its closing marker, say) when it parses.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let held = std::mem::take(&mut self.held);
        if self.in_call {
            self.in_call = false;
            self.call(&held, false, &mut pieces);
        } else {
            self.text(held, true, &mut pieces);
        }
        self.gap.clear();
        pieces
    }

    /// Text outside calls; whitespace right after a call waits to see what follows it
    /// (`before_call`: a call or the end follows this text).
    fn text(&mut self, text: String, before_call: bool, pieces: &mut Vec<Piece>) {
        if self.calls > 0 && self.gap.len() + text.len() > 0 {
            let all_space = text.chars().all(char::is_whitespace);
            if all_space && !before_call {
                self.gap.push_str(&text);
                return;
            }
            let gap = std::mem::take(&mut self.gap);
            if all_space {
                return;
            }
            push_text(pieces, gap + &text);
            return;
        }
        push_text(pieces, text);
    }

    fn call(&mut self, body: &str, closed: bool, pieces: &mut Vec<Piece>) {
        match self.syntax.parse(body) {
            Some(call) => {
                self.gap.clear();
                if self.calls == 0 || self.parallel {
                    pieces.push(Piece::Call(self.calls, call));
                    self.calls += 1;
                }
            }
            None => {
                let close = if closed { self.syntax.close() } else { "" };
                let raw = format!("{}{body}{close}", self.syntax.open());
                self.text(raw, false, pieces);
            }
        }
    }
}

fn push_text(pieces: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    match pieces.last_mut() {
        Some(Piece::Text(last)) => last.push_str(&text),
        _ => pieces.push(Piece::Text(text)),
    }
}

/// The length of the longest end of `text` that begins `marker` (and is not all of it).
fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// The whole output at once: its text outside calls (trimmed when there are calls) and
/// the calls.
pub fn split_whole(syntax: ToolSyntax, parallel: bool, text: &str) -> (String, Vec<ToolCall>) {
    let mut stream = ToolStream::new(syntax, parallel);
    let mut pieces = stream.push(text);
    pieces.extend(stream.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => content.push_str(&text),
            Piece::Call(_, call) => calls.push(call),
        }
    }
    if !calls.is_empty() {
        content = content.trim().to_owned();
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL_A: &str = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    const CALL_B: &str = "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";

    /// Feeds `text` in pieces of `step` bytes (at char boundaries), then finishes.
    fn run(stream: &mut ToolStream, text: &str, step: usize) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = step.min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let (head, tail) = rest.split_at(cut);
            for piece in stream.push(head) {
                match (pieces.last_mut(), piece) {
                    (Some(Piece::Text(last)), Piece::Text(more)) => last.push_str(&more),
                    (_, piece) => pieces.push(piece),
                }
            }
            rest = tail;
        }
        for piece in stream.finish() {
            match (pieces.last_mut(), piece) {
                (Some(Piece::Text(last)), Piece::Text(more)) => last.push_str(&more),
                (_, piece) => pieces.push(piece),
            }
        }
        pieces
    }

    fn shape(pieces: &[Piece]) -> Vec<String> {
        pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => format!("text {text:?}"),
                Piece::Call(i, call) => format!("call {i} {} {}", call.name, call.arguments),
            })
            .collect()
    }

    #[test]
    fn calls_are_cut_out_of_the_text_however_it_is_split() {
        let text = format!("Let me check 🚀 <tool_ahead.\n{CALL_A}\n{CALL_B}\n");
        for step in [1, 2, 3, 5, 7, 64, 1000] {
            let mut stream = ToolStream::new(ToolSyntax::Qwen, true);
            let pieces = run(&mut stream, &text, step);
            assert_eq!(
                shape(&pieces),
                [
                    "text \"Let me check 🚀 <tool_ahead.\\n\"",
                    "call 0 a {\"x\":1}",
                    "call 1 b {}",
                ],
                "step {step}"
            );
            assert_eq!(stream.calls(), 2);
        }
    }

    #[test]
    fn text_streams_until_a_marker_could_start() {
        let mut stream = ToolStream::new(ToolSyntax::Qwen, true);
        assert_eq!(stream.push("Hello <to"), [Piece::Text("Hello ".into())]);
        assert_eq!(stream.push("y> there"), [Piece::Text("<toy> there".into())]);
        assert_eq!(stream.push("<tool_call>{\"name\""), []);
        let pieces = stream.push(": \"f\"}</tool_call>after");
        assert_eq!(shape(&pieces), ["call 0 f {}", "text \"after\""]);
        assert_eq!(stream.finish(), []);
    }

    #[test]
    fn broken_and_unclosed_calls() {
        let mut stream = ToolStream::new(ToolSyntax::Qwen, true);
        let pieces = run(&mut stream, "<tool_call>\nnot json\n</tool_call> then", 4);
        assert_eq!(
            shape(&pieces),
            ["text \"<tool_call>\\nnot json\\n</tool_call> then\""]
        );
        assert_eq!(stream.calls(), 0);
        // A stop string at the closing marker leaves the call unclosed but whole.
        let mut stopped = ToolStream::new(ToolSyntax::Qwen, true);
        let pieces = run(&mut stopped, "<tool_call>\n{\"name\": \"f\"}\n", 3);
        assert_eq!(shape(&pieces), ["call 0 f {}"]);
        // Cut by max_tokens mid-call: the text as written.
        let mut cut = ToolStream::new(ToolSyntax::Qwen, true);
        let pieces = run(&mut cut, "<tool_call>\n{\"name\": \"f\", \"argu", 3);
        assert_eq!(
            shape(&pieces),
            ["text \"<tool_call>\\n{\\\"name\\\": \\\"f\\\", \\\"argu\""]
        );
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_reported() {
        let text = format!("{CALL_A}\n{CALL_B}");
        let mut stream = ToolStream::new(ToolSyntax::Qwen, false);
        assert_eq!(shape(&run(&mut stream, &text, 9)), ["call 0 a {\"x\":1}"]);
        assert_eq!(stream.calls(), 1);
    }

    #[test]
    fn text_after_a_call_keeps_its_leading_space() {
        let mut stream = ToolStream::new(ToolSyntax::Qwen, true);
        let pieces = run(&mut stream, &format!("{CALL_A}\n\nDone."), 2);
        assert_eq!(
            shape(&pieces),
            ["call 0 a {\"x\":1}", "text \"\\n\\nDone.\""]
        );
    }

    #[test]
    fn gemma_markers() {
        let text =
            "Sure.<|tool_call>call:f{q:<|\"|>a<|\"|>}<tool_call|><|tool_call>call:g{}<tool_call|>";
        let mut stream = ToolStream::new(ToolSyntax::Gemma4, true);
        assert_eq!(
            shape(&run(&mut stream, text, 3)),
            ["text \"Sure.\"", "call 0 f {\"q\":\"a\"}", "call 1 g {}"]
        );
    }

    #[test]
    fn whole_outputs_split_into_content_and_calls() {
        let (content, calls) =
            split_whole(ToolSyntax::Qwen, true, &format!("I'll look.\n{CALL_A}\n"));
        assert_eq!(content, "I'll look.");
        assert_eq!(calls.len(), 1);
        let (content, calls) = split_whole(ToolSyntax::Qwen, true, "  plain  ");
        assert_eq!((content.as_str(), calls.len()), ("  plain  ", 0));
    }

    #[test]
    fn partial_markers_are_measured_at_the_end() {
        assert_eq!(partial_marker("abc<tool_", "<tool_call>"), 6);
        assert_eq!(partial_marker("abc", "<tool_call>"), 0);
        assert_eq!(partial_marker("<", "<tool_call>"), 1);
        assert_eq!(partial_marker("", "<tool_call>"), 0);
    }
}
