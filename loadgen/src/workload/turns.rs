//! Multi-turn sessions (`--turns`): a session's history as messages, and
//! the one text a completions or gRPC prompt makes of them. Each turn's
//! prompt is the previous turn's prompt, its reply and the new message, so
//! a server with a prefix cache finds every earlier turn cached.
//!
//! The chat endpoint gets the messages as they are (`messages`, the user's
//! and the assistant's roles); the other doors get [`flatten`]: every
//! message in order, a reply right after its message (the reply continued
//! that text), a new message on a new line.

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The client's message.
    User,
    /// The server's reply.
    Assistant,
}

impl Role {
    /// The OpenAI role name.
    pub fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A user message.
    pub fn user(content: String) -> Message {
        Message {
            role: Role::User,
            content,
        }
    }

    /// A reply.
    pub fn assistant(content: String) -> Message {
        Message {
            role: Role::Assistant,
            content,
        }
    }
}

/// The history as one prompt text: each reply right after its message, each
/// new message on a new line.
pub fn flatten(messages: &[Message]) -> String {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 && m.role == Role::User {
            out.push('\n');
        }
        out.push_str(&m.content);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_turn_extends_the_last() {
        let mut h = vec![Message::user("Hi.".into())];
        let first = flatten(&h);
        h.push(Message::assistant(" Hello!".into()));
        h.push(Message::user("More?".into()));
        let second = flatten(&h);
        assert_eq!(second, "Hi. Hello!\nMore?");
        assert!(second.starts_with(&first), "the prefix is the last turn");
        assert_eq!(Role::Assistant.name(), "assistant");
    }
}
