//! The workload's unit tests: prompts (repeated, unique with the nonce,
//! tokenized, decoded for chat, behind shared prefixes, as sessions' first
//! messages), synthetic lengths, datasets.

use super::*;

/// The defaults of the flags, changed by `edit`.
fn config(edit: impl FnOnce(&mut WorkloadConfig)) -> WorkloadConfig {
    let mut c = WorkloadConfig {
        base_prompt: "The quick brown fox".into(),
        dataset: None,
        input_len: None,
        output_len: None,
        unique: false,
        pretok: false,
        text_only: false,
        max_new_tokens: Some(32),
        stream: true,
        shared_prefix: None,
        turns: 1,
        count_prompt_tokens: false,
        ignore_eos: false,
        sampling: None,
        seed: 0,
        nonce: "n1".into(),
    };
    edit(&mut c);
    c
}

fn ids(p: &PreparedRequest) -> Vec<u32> {
    match &p.prompt {
        Prompt::Ids(ids) => ids.clone(),
        other => panic!("expected ids, got {other:?}"),
    }
}

fn workload(edit: impl FnOnce(&mut WorkloadConfig)) -> Workload {
    Workload::new(&config(edit)).expect("builds")
}

#[test]
fn text_prompts_repeat_and_unique() {
    let w = workload(|c| {
        c.base_prompt = "hi hi hi".into();
        c.unique = true;
    });
    let reqs = w.build("r0", 2).expect("builds");
    assert_eq!(reqs[0].prompt, Prompt::Text("[n1.r0.0] hi hi hi".into()));
    assert_eq!(reqs[1].prompt, Prompt::Text("[n1.r0.1] hi hi hi".into()));
    assert_ne!(reqs[0].request_id, reqs[1].request_id);
    assert!(reqs[0].sampling.is_none(), "greedy sends no sampling");
    assert_eq!(reqs[0].max_new_tokens, Some(32));
    assert!(!reqs[0].ignore_eos);
    let other = workload(|c| {
        c.base_prompt = "hi hi hi".into();
        c.unique = true;
        c.nonce = "n2".into();
    });
    assert_ne!(
        other.build("r0", 1).expect("builds")[0].prompt,
        reqs[0].prompt,
        "another invocation's nonce: other prompts"
    );
}

#[test]
fn no_limit_and_client_side_counts() {
    let w = workload(|c| {
        c.base_prompt = "Hello world".into();
        c.max_new_tokens = None;
        c.stream = false;
        c.count_prompt_tokens = true;
    });
    let r = &w.build("r0", 1).expect("builds")[0];
    assert_eq!(r.max_new_tokens, None, "no limit sent");
    assert!(!r.stream);
    assert_eq!(r.prompt, Prompt::Text("Hello world".into()), "still text");
    assert_eq!(r.prompt_tokens, Some(2), "counted with the GPT-2 tokenizer");
}

#[test]
fn pretok_sends_ids_and_sampling_seeds_differ() {
    let w = workload(|c| {
        c.pretok = true;
        c.base_prompt = "Hello world".into();
        c.sampling = Some(Sampling {
            temperature: Some(0.8),
            ..Sampling::default()
        });
        c.seed = 10;
        c.ignore_eos = true;
    });
    let reqs = w.build("w0", 2).expect("builds");
    // GPT-2: "Hello" = 15496, " world" = 995.
    assert_eq!(reqs[0].prompt, Prompt::Ids(vec![15496, 995]));
    assert_eq!(reqs[0].prompt_tokens, Some(2));
    assert!(reqs[0].ignore_eos);
    let seeds: Vec<_> = reqs
        .iter()
        .map(|r| r.sampling.and_then(|s| s.seed))
        .collect();
    assert_eq!(seeds, vec![Some(10), Some(11)]);
}

#[test]
fn synthetic_lengths_are_drawn_and_seeded() {
    let w = workload(|c| {
        c.input_len = Some(LenDist::Uniform { lo: 5, hi: 9 });
        c.output_len = Some(LenDist::Normal {
            mean: 20.0,
            stdev: 3.0,
        });
        c.seed = 4;
    });
    let a = w.build("r0", 200).expect("builds");
    let b = w.build("r0", 200).expect("builds");
    let all_ids = |r: &[PreparedRequest]| r.iter().map(ids).collect::<Vec<_>>();
    assert_eq!(all_ids(&a), all_ids(&b), "same seed and run: same prompts");
    assert_ne!(
        all_ids(&a),
        all_ids(&w.build("r1", 200).expect("builds")),
        "other run: other prompts"
    );
    assert!(a.iter().all(|p| (5..=9).contains(&ids(p).len())));
    assert!(a.iter().all(|p| ids(p).iter().all(|&t| t < EOS_ID)));
    assert!(a
        .iter()
        .all(|p| p.prompt_tokens == Some(ids(p).len() as u32)));
    let mean = a
        .iter()
        .map(|p| f64::from(p.max_new_tokens.unwrap_or(0)))
        .sum::<f64>()
        / 200.0;
    assert!((mean - 20.0).abs() < 1.5, "mean output length {mean}");
    assert!(
        a.iter().any(|p| p.max_new_tokens != Some(20)),
        "drawn, not fixed"
    );
}

#[test]
fn dataset_entries_cycle_and_set_lengths() {
    let path = std::env::temp_dir().join(format!("lg-wl-{}.jsonl", std::process::id()));
    std::fs::write(
        &path,
        "{\"prompt\":\"a b\",\"max_new_tokens\":3}\n{\"prompt_token_ids\":[7,8]}\n",
    )
    .expect("write");
    let w = workload(|c| {
        c.dataset = Some((path.clone(), DatasetFormat::Jsonl));
        c.max_new_tokens = Some(9);
    });
    let r = w.build("r0", 3).expect("builds");
    let _ = std::fs::remove_file(&path);
    assert_eq!(r[0].prompt, Prompt::Text("a b".into()));
    assert_eq!(r[0].max_new_tokens, Some(3));
    assert_eq!(r[1].prompt, Prompt::Ids(vec![7, 8]));
    assert_eq!(r[1].max_new_tokens, Some(9), "no max_new_tokens: the flag");
    assert_eq!(r[2].prompt, Prompt::Text("a b".into()), "entries cycle");
}

#[test]
fn chat_decodes_token_id_prompts_to_text() {
    let w = workload(|c| {
        c.text_only = true;
        c.input_len = Some(LenDist::Fixed { n: 4 });
    });
    let r = w.build("r0", 2).expect("builds");
    for p in &r {
        match &p.prompt {
            Prompt::Text(t) => assert!(!t.is_empty(), "decoded text"),
            other => panic!("chat sends text, not {other:?}"),
        }
        assert_eq!(p.prompt_tokens, None, "the server counts decoded text");
    }
}

#[test]
fn shared_prefixes_lead_and_change_with_the_nonce() {
    let w = workload(|c| {
        c.shared_prefix = Some((8, 2));
        c.unique = true;
    });
    let r = w.build("r0", 4).expect("builds");
    let p: Vec<Vec<u32>> = r.iter().map(ids).collect();
    assert_eq!(p[0][..8], p[2][..8], "request i takes prefix i % K");
    assert_ne!(p[0][..8], p[1][..8]);
    assert_ne!(p[0], p[2], "the suffixes differ");
    assert!(p.iter().all(|x| x.len() > 8));
    let again = workload(|c| {
        c.shared_prefix = Some((8, 2));
        c.unique = true;
    });
    assert_eq!(
        ids(&again.build("r1", 1).expect("builds")[0])[..8],
        p[0][..8],
        "same invocation"
    );
    let other = workload(|c| {
        c.shared_prefix = Some((8, 2));
        c.unique = true;
        c.nonce = "n2".into();
    });
    assert_ne!(
        ids(&other.build("r0", 1).expect("builds")[0])[..8],
        p[0][..8]
    );
}

#[test]
fn sessions_start_with_one_text_message() {
    let w = workload(|c| {
        c.turns = 3;
        c.input_len = Some(LenDist::Fixed { n: 4 });
    });
    match &w.build("r0", 1).expect("builds")[0].prompt {
        Prompt::Turns(m) => {
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].role, turns::Role::User);
            assert!(!m[0].content.is_empty(), "ids decoded to text");
        }
        other => panic!("{other:?}"),
    }
    assert!(w.build("r0", 1).expect("builds")[0].keep_reply);
}
