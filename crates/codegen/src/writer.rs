//! An indenting text writer for C source.

#[derive(Default)]
pub(crate) struct CodeWriter {
    text: String,
    depth: usize,
}

impl CodeWriter {
    pub(crate) fn new() -> CodeWriter {
        CodeWriter::default()
    }

    /// Writes one line at the current indentation (an empty string writes an empty line).
    pub(crate) fn line(&mut self, line: impl AsRef<str>) {
        let line = line.as_ref();
        if !line.is_empty() {
            for _ in 0..self.depth {
                self.text.push_str("  ");
            }
            self.text.push_str(line);
        }
        self.text.push('\n');
    }

    /// Writes `head {` and indents what follows.
    pub(crate) fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.depth += 1;
    }

    /// Ends the innermost block opened by [`CodeWriter::open`].
    pub(crate) fn close(&mut self) {
        self.depth -= 1;
        self.line("}");
    }

    /// Ends the innermost block and opens another at the same depth: `} head {`.
    pub(crate) fn reopen(&mut self, head: impl AsRef<str>) {
        self.depth -= 1;
        self.line(format!("}} {} {{", head.as_ref()));
        self.depth += 1;
    }

    /// Ends the innermost block with `}` followed by `suffix` (a struct's `;`).
    pub(crate) fn close_with(&mut self, suffix: &str) {
        self.depth -= 1;
        self.line(format!("}}{suffix}"));
    }

    pub(crate) fn finish(self) -> String {
        debug_assert_eq!(self.depth, 0, "unbalanced blocks");
        self.text
    }
}
