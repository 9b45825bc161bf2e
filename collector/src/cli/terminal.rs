//! Text from a server, a database or an agent, made safe to print on a terminal.
//!
//! Node names, reasons, error texts and anything else that reaches stdout or stderr may carry
//! escape sequences (a title change, a screen clear, a hyperlink) or bidirectional overrides
//! that make a line read other than it is. Every such character is printed as its escape
//! (`\u{1b}`), never as itself; the rest of the text is unchanged. JSON and YAML output keep
//! their syntax: the characters a JSON encoder leaves raw (C1 controls, bidi controls, line and
//! paragraph separators) are written as `\uXXXX` escapes, valid in both.

use std::borrow::Cow;

/// The longest error text from a server the CLI prints.
pub const MAX_MESSAGE: usize = 500;

/// Characters a terminal acts on or that reorder what it shows.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `s` with every control, bidi and separator character as its escape (`\u{1b}`).
pub fn safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` made safe and cut to `max` characters (a `…` says it was).
pub fn bounded(s: &str, max: usize) -> String {
    let safe = safe(s);
    if safe.chars().count() <= max {
        return safe.into_owned();
    }
    let mut cut: String = safe.chars().take(max).collect();
    cut.push('…');
    cut
}

/// JSON (or YAML of JSON string literals) with the characters a JSON encoder leaves raw written
/// as `\uXXXX` escapes. Those characters can only occur inside string literals, where the
/// escape means the same character.
pub fn json_safe(text: String) -> String {
    if !text.chars().any(|c| unsafe_char(c) && c != '\n') {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c != '\n' && unsafe_char(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A URL with its userinfo (`user:password@`) replaced, for an error message.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => safe(&format!("{scheme}***@{}", &rest[at + 1..])).into_owned(),
        None => safe(url).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_shown_not_run_and_plain_text_is_untouched() {
        assert!(matches!(safe("gpu-node-07 mlx5_3"), Cow::Borrowed(_)));
        assert_eq!(safe("a\u{1b}]0;pwned\u{7}b"), "a\\u{1b}]0;pwned\\u{7}b");
        assert_eq!(safe("x\u{9b}2Jy"), "x\\u{9b}2Jy", "an 8-bit CSI");
        assert_eq!(safe("abc\u{202e}fed"), "abc\\u{202e}fed", "a right-to-left override");
        assert_eq!(safe("line\nbreak\r"), "line\\u{a}break\\u{d}");
        assert_eq!(bounded(&"é".repeat(600), 500).chars().count(), 501);
    }

    #[test]
    fn json_stays_json_and_shows_no_raw_control() {
        let v = serde_json::json!({"node": "n\u{9b}2J\u{202e}\u{2028}\u{1b}[2J", "emoji": "🙂"});
        let text = json_safe(serde_json::to_string_pretty(&v).unwrap());
        assert!(!text.chars().any(|c| c != '\n' && unsafe_char(c)), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v, "the same value");
    }

    #[test]
    fn userinfo_never_reaches_a_message() {
        assert_eq!(redacted_url("https://admin:s3cret@collector:7701/api"), "https://***@collector:7701/api");
        assert_eq!(redacted_url("http://collector:7701/a@b"), "http://collector:7701/a@b");
        assert_eq!(redacted_url("collector\u{1b}[2J"), "collector\\u{1b}[2J");
    }

    /// What a hostile server or agent can put in front of the CLI's terminal (node names, reasons,
    /// error texts, URLs) under 30,000 mutated texts: the terminal's form holds no character a
    /// terminal acts on, the JSON form parses back to the very text, the bounded form is bounded,
    /// and a URL's password never survives redaction.
    #[test]
    fn mutated_server_texts_never_reach_the_terminal_raw() {
        use rand::{Rng, SeedableRng};
        let seeds = [
            "node-a",
            "\u{1b}]0;owned\u{7}title",
            "\u{1b}[2J\u{1b}[Hclear",
            "abc\u{202e}gnp.exe",
            "line\u{2028}sep\u{85}nel\u{9b}31m",
            "\u{1b}]8;;https://evil.example\u{1b}\\link\u{1b}]8;;\u{1b}\\",
        ];
        let alphabet: Vec<char> =
            "\u{1b}\u{7}\u{9b}\u{85}\u{202e}\u{2066}\u{2028}\u{200f}\r\n\t\u{0}[];:/@?#%\"\\aZ0\u{e9}\u{1f600}"
                .chars()
                .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let terminal_acts_on = |c: char| {
            c.is_control()
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
        };
        let mut changed = 0;
        for _ in 0..30_000 {
            let mut t: Vec<char> = seeds[rng.random_range(0..seeds.len())].chars().collect();
            for _ in 0..rng.random_range(1..6) {
                let i = rng.random_range(0..=t.len());
                let c = if rng.random_range(0..4) == 0 {
                    char::from_u32(rng.random_range(0..0x3000)).unwrap_or('?')
                } else {
                    alphabet[rng.random_range(0..alphabet.len())]
                };
                t.insert(i, c);
            }
            let text: String = t.into_iter().collect();
            let shown = safe(&text);
            changed += usize::from(shown != text);
            assert!(!shown.chars().any(terminal_acts_on), "{text:?} shown as {shown:?}");
            let cut = bounded(&text, 20);
            assert!(cut.chars().count() <= 21 && !cut.chars().any(terminal_acts_on), "{cut:?}");
            let json = json_safe(serde_json::to_string(&serde_json::json!({ "node": text })).unwrap());
            assert!(!json.chars().any(terminal_acts_on), "{json:?}");
            let back: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(back["node"], text.as_str(), "the JSON form means the same text");
            // A password in a URL's userinfo, whatever the rest of the URL holds.
            let password = format!("pw{}", rng.random::<u64>());
            let url = format!("postgres://railguard:{password}@{}/db?x={text}", text.replace(['/', '?', '#'], ""));
            let red = redacted_url(&url);
            assert!(!red.contains(&password) && !red.chars().any(terminal_acts_on), "{url:?} -> {red:?}");
        }
        assert!(changed > 20_000, "the hostile characters were exercised: {changed}");
    }
}
