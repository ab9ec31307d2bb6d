//! The configuration of a Gemma 4 GGUF, rebuilt from its metadata as the `config.json`
//! fields the safetensors path resolves.

use super::meta::Meta;
use super::*;

impl GgufStore {
    /// The metadata as the `config.json` fields of a `gemma4_text` checkpoint.
    pub(super) fn config_json(&self) -> Result<Json> {
        self.text_config_json(ARCHITECTURE, "a Gemma 4 text model")
    }

    /// The `gemma4_text` fields of a file of architecture `architecture` (`what` names it in
    /// the error for another one), whose keys are the text model's under that prefix: an
    /// assistant's are.
    pub(super) fn text_config_json(&self, architecture: &str, what: &str) -> Result<Json> {
        let meta = Meta(self.file.metadata());
        let arch = meta.string("general.architecture")?;
        if arch != architecture {
            return Err(ModelError::config(
                "general.architecture",
                format!("expected {architecture:?} ({what}), found {arch:?}"),
            ));
        }
        let key = |k: &str| format!("{architecture}.{k}");
        let experts = self.experts(&meta, architecture)?;

        let num_layers = meta.usize(&key("block_count"))?;
        let hidden = meta.usize(&key("embedding_length"))?;
        let heads = meta.uniform(&key("attention.head_count"), num_layers)?;
        let head_dim_full = meta.usize(&key("attention.key_length"))?;
        let head_dim_sliding = meta
            .usize_opt(&key("attention.key_length_swa"))?
            .unwrap_or(head_dim_full);
        for (k, want) in [
            ("attention.value_length", head_dim_full),
            ("attention.value_length_swa", head_dim_sliding),
        ] {
            if let Some(found) = meta.usize_opt(&key(k))? {
                if found != want {
                    return Err(ModelError::Unsupported(format!(
                        "GGUF metadata {}: {found} differs from the key length {want}",
                        key(k)
                    )));
                }
            }
        }

        let pattern_key = key("attention.sliding_window_pattern");
        let mut full: Vec<bool> = meta
            .bools(&pattern_key)?
            .into_iter()
            .map(|sliding| !sliding)
            .collect();
        if full.len() != num_layers {
            return Err(ModelError::config(
                &pattern_key,
                format!("has {} entries for {num_layers} layers", full.len()),
            ));
        }
        // transformers forces the last layer to full attention; do the same so numbers agree.
        if let Some(last) = full.last_mut() {
            *last = true;
        }
        let shared_key = key("attention.shared_kv_layers");
        let num_shared = meta.usize_opt(&shared_key)?.unwrap_or(0);
        if num_shared > num_layers {
            return Err(ModelError::config(
                &shared_key,
                format!("{num_shared} exceeds the {num_layers} layers"),
            ));
        }
        let first_shared = num_layers - num_shared;
        let head_dim = |i: usize| {
            if full[i] {
                head_dim_full
            } else {
                head_dim_sliding
            }
        };

        // KV heads and k_eq_v from the projections themselves (see the module docs).
        let mut kv_heads = vec![None; num_layers];
        let mut k_eq_v = None;
        for i in 0..first_shared {
            let k_name = format!("blk.{i}.attn_k.weight");
            let rows = self.dims(&k_name)?.first().copied().unwrap_or(0);
            if rows == 0 || !rows.is_multiple_of(head_dim(i)) {
                return Err(ModelError::Invalid(format!(
                    "tensor {k_name}: {rows} rows are not whole heads of {}",
                    head_dim(i)
                )));
            }
            kv_heads[i] = Some(rows / head_dim(i));
            let v_name = format!("blk.{i}.attn_v.weight");
            let has_v = self.file.has_tensor(&v_name);
            if !full[i] {
                if !has_v {
                    return Err(ModelError::MissingTensor { name: v_name });
                }
                continue;
            }
            match k_eq_v {
                None => k_eq_v = Some(!has_v),
                Some(keq) if keq == has_v => {
                    let (here, before) = if has_v {
                        ("present", "absent")
                    } else {
                        ("absent", "present")
                    };
                    return Err(ModelError::Unsupported(format!(
                        "tensor {v_name}: {here} on this full-attention layer but {before} on \
                         an earlier one (values from keys must hold for all or none)"
                    )));
                }
                Some(_) => {}
            }
        }
        for i in first_shared..num_layers {
            kv_heads[i] = (0..first_shared)
                .rev()
                .find(|&j| full[j] == full[i])
                .and_then(|j| kv_heads[j]);
        }
        let mut per_layer_config = Map::new();
        for (i, heads) in kv_heads.iter().enumerate() {
            let mut layer = Map::new();
            layer.insert("head_dim".into(), json!(head_dim(i)));
            if let Some(heads) = heads {
                layer.insert("num_key_value_heads".into(), json!(heads));
            }
            per_layer_config.insert(i.to_string(), Json::Object(layer));
        }
        let sliding_kv = (0..num_layers)
            .find(|&i| !full[i])
            .and_then(|i| kv_heads[i])
            .or(kv_heads.iter().flatten().next().copied())
            .unwrap_or(1);

        let ffn_key = key("feed_forward_length");
        let ffn = meta.per_layer(&ffn_key, num_layers)?;
        let intermediate = ffn.first().copied().unwrap_or(0);
        let double_wide = if ffn.iter().all(|&n| n == intermediate) {
            false
        } else if ffn[..first_shared].iter().all(|&n| n == intermediate)
            && ffn[first_shared..].iter().all(|&n| n == 2 * intermediate)
        {
            true
        } else {
            return Err(ModelError::Unsupported(format!(
                "GGUF metadata {ffn_key}: {ffn:?} is neither one width nor the double-wide \
                 pattern (KV-shared layers twice the others)"
            )));
        };

        let embed = self.dims("token_embd.weight")?;
        let &[vocab, embed_width] = embed.as_slice() else {
            return Err(ModelError::Invalid(format!(
                "tensor token_embd.weight: expected 2 dimensions, found {embed:?}"
            )));
        };
        if embed_width != hidden {
            return Err(ModelError::ShapeMismatch {
                name: "token_embd.weight".into(),
                expected: vec![vocab, hidden],
                found: embed,
            });
        }
        let ple = meta
            .usize_opt(&key("embedding_length_per_layer_input"))?
            .unwrap_or(0);
        // Without per-layer embeddings there is no per-layer table, and no vocabulary for one.
        let per_layer_vocab = if ple > 0 {
            self.dims("per_layer_token_embd.weight")?
                .first()
                .copied()
                .unwrap_or(0)
        } else {
            0
        };

        let mut eos = Vec::new();
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = meta.usize_opt(k)? {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        let layer_types: Vec<&str> = full
            .iter()
            .map(|&f| {
                if f {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();

        let mut config = json!({
            "model_type": "gemma4_text",
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "use_double_wide_mlp": double_wide,
            "num_hidden_layers": num_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": sliding_kv,
            "head_dim": head_dim_sliding,
            "attention_k_eq_v": k_eq_v.unwrap_or(false),
            "num_kv_shared_layers": num_shared,
            "hidden_size_per_layer_input": ple,
            "vocab_size_per_layer_input": per_layer_vocab,
            "layer_types": layer_types,
            "per_layer_config": per_layer_config,
            "rope_parameters": self.rope(&meta, architecture, head_dim_full, head_dim_sliding)?,
            "rms_norm_eps": meta.f64(&key("attention.layer_norm_rms_epsilon"))?,
            "sliding_window": meta.usize(&key("attention.sliding_window"))?,
            "max_position_embeddings": meta.usize(&key("context_length"))?,
            "attention_bias": self.file.has_tensor("blk.0.attn_q.bias"),
            "tie_word_embeddings": !self.file.has_tensor("output.weight"),
            "eos_token_id": eos,
        });
        if let Json::Object(fields) = &mut config {
            if let Some(cap) = meta.f64_opt(&key("final_logit_softcapping"))? {
                fields.insert("final_logit_softcapping".into(), json!(cap));
            }
            if let Some(bos) = meta.usize_opt("tokenizer.ggml.bos_token_id")? {
                fields.insert("bos_token_id".into(), json!(bos));
            }
            if let Some(moe) = experts {
                fields.extend(moe);
            }
        }
        Ok(config)
    }

    /// The `config.json` fields of a mixture-of-experts block, `None` for a dense file.
    fn experts(&self, meta: &Meta<'_>, architecture: &str) -> Result<Option<Map<String, Json>>> {
        let key = |k: &str| format!("{architecture}.{k}");
        let count_key = key("expert_count");
        let count = meta.usize_opt(&count_key)?.unwrap_or(0);
        if count == 0 {
            // A router without experts would otherwise be ignored and the block silently dropped.
            const ROUTER: &str = "blk.0.ffn_gate_inp.weight";
            if self.file.has_tensor(ROUTER) {
                return Err(ModelError::Invalid(format!(
                    "tensor {ROUTER}: a mixture-of-experts router, but {count_key} is {}",
                    if meta.0.contains_key(&count_key) {
                        "0"
                    } else {
                        "missing"
                    }
                )));
            }
            return Ok(None);
        }
        let mut fields = Map::new();
        fields.insert("enable_moe_block".into(), json!(true));
        fields.insert("num_experts".into(), json!(count));
        fields.insert(
            "top_k_experts".into(),
            json!(meta.usize(&key("expert_used_count"))?),
        );
        fields.insert(
            "moe_intermediate_size".into(),
            json!(meta.usize(&key("expert_feed_forward_length"))?),
        );
        Ok(Some(fields))
    }

    /// `rope_parameters` of both layer types.
    fn rope(
        &self,
        meta: &Meta<'_>,
        architecture: &str,
        head_dim_full: usize,
        head_dim_sliding: usize,
    ) -> Result<Json> {
        let key = |k: &str| format!("{architecture}.{k}");
        let scaling_key = key("rope.scaling.type");
        if let Some(scaling) = meta.0.get(&scaling_key) {
            if !matches!(scaling, Value::String(s) if s == "none") {
                return Err(ModelError::Unsupported(format!(
                    "GGUF metadata {scaling_key}: RoPE scaling {scaling:?} is not supported"
                )));
            }
        }
        for (k, want) in [
            ("rope.dimension_count", head_dim_full),
            ("rope.dimension_count_swa", head_dim_sliding),
        ] {
            if let Some(found) = meta.usize_opt(&key(k))? {
                if found != want {
                    return Err(ModelError::Unsupported(format!(
                        "GGUF metadata {}: {found} rotated dimensions of a {want}-wide head \
                         (partial rotation is read from rope_freqs.weight)",
                        key(k)
                    )));
                }
            }
        }
        let theta_full = meta.f64(&key("rope.freq_base"))?;
        // llama.cpp's default for a file without a sliding base.
        let theta_sliding = meta
            .f64_opt(&key("rope.freq_base_swa"))?
            .unwrap_or(theta_full);
        let full = match self.rotated_pairs(head_dim_full)? {
            Some(pairs) => {
                let factor = (2 * pairs) as f64 / head_dim_full as f64;
                // The model derives the pair count back as (factor * head_dim) / 2; make sure it
                // lands on the same integer.
                if (factor * head_dim_full as f64) as usize / 2 != pairs {
                    return Err(ModelError::Unsupported(format!(
                        "tensor rope_freqs.weight: {pairs} rotated pairs of a {head_dim_full}-wide \
                         head cannot be expressed as a partial rotary factor"
                    )));
                }
                json!({
                    "rope_type": "proportional",
                    "rope_theta": theta_full,
                    "partial_rotary_factor": factor,
                })
            }
            None => json!({"rope_type": "default", "rope_theta": theta_full}),
        };
        Ok(json!({
            "sliding_attention": {"rope_type": "default", "rope_theta": theta_sliding},
            "full_attention": full,
        }))
    }

    /// The pairs of a full-attention head that rotate, from `rope_freqs.weight` (1 for a rotated
    /// pair, 1e30 for one left as it is); `None` without the tensor.
    fn rotated_pairs(&self, head_dim_full: usize) -> Result<Option<usize>> {
        const NAME: &str = "rope_freqs.weight";
        if !self.file.has_tensor(NAME) {
            return Ok(None);
        }
        let factors = self
            .dense(NAME)?
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        if factors.len() != head_dim_full / 2 {
            return Err(ModelError::ShapeMismatch {
                name: NAME.into(),
                expected: vec![head_dim_full / 2],
                found: vec![factors.len()],
            });
        }
        let pairs = factors.iter().take_while(|&&f| f == 1.0).count();
        if let Some(odd) = factors[pairs..].iter().find(|&&f| f < UNROTATED_FACTOR) {
            return Err(ModelError::Unsupported(format!(
                "tensor {NAME}: frequency factor {odd} (only 1 for rotated pairs, then 1e30 for \
                 unrotated ones, are supported)"
            )));
        }
        Ok(Some(pairs))
    }
}
