//! Typed tensor names of a BERT checkpoint: every tensor the encoder reads is a `BertTensor`,
//! and its Hugging Face name comes from one table, so a misspelt name is a compile error rather
//! than a lookup of another tensor.

/// One tensor role of a BERT encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertTensor {
    /// Word embeddings [vocab, hidden].
    WordEmbeddings,
    /// Absolute position embeddings [max_positions, hidden].
    PositionEmbeddings,
    /// Token-type (segment) embeddings [type_vocab, hidden].
    TokenTypeEmbeddings,
    /// LayerNorm after the embedding sum: weight.
    EmbeddingNormWeight,
    /// LayerNorm after the embedding sum: bias.
    EmbeddingNormBias,
    /// Query projection of layer `i`: weight.
    QueryWeight(usize),
    /// Query projection: bias.
    QueryBias(usize),
    /// Key projection: weight.
    KeyWeight(usize),
    /// Key projection: bias.
    KeyBias(usize),
    /// Value projection: weight.
    ValueWeight(usize),
    /// Value projection: bias.
    ValueBias(usize),
    /// Attention output projection: weight.
    AttnOutWeight(usize),
    /// Attention output projection: bias.
    AttnOutBias(usize),
    /// LayerNorm after attention + residual: weight.
    AttnNormWeight(usize),
    /// LayerNorm after attention + residual: bias.
    AttnNormBias(usize),
    /// FFN up projection (`intermediate.dense`): weight.
    FfnUpWeight(usize),
    /// FFN up projection: bias.
    FfnUpBias(usize),
    /// FFN down projection (`output.dense`): weight.
    FfnDownWeight(usize),
    /// FFN down projection: bias.
    FfnDownBias(usize),
    /// LayerNorm after FFN + residual: weight.
    FfnNormWeight(usize),
    /// LayerNorm after FFN + residual: bias.
    FfnNormBias(usize),
    /// The pooler's dense layer over `[CLS]` (sequence classifiers): weight [hidden, hidden].
    PoolerWeight,
    /// The pooler's dense layer: bias.
    PoolerBias,
}

impl BertTensor {
    /// The Hugging Face name (`BertModel` layout), after `prefix` (`""` or `"bert."`).
    pub fn hf_name(self, prefix: &str) -> String {
        use BertTensor::*;
        let layer = |i: usize, rest: &str| format!("{prefix}encoder.layer.{i}.{rest}");
        match self {
            WordEmbeddings => format!("{prefix}embeddings.word_embeddings.weight"),
            PositionEmbeddings => format!("{prefix}embeddings.position_embeddings.weight"),
            TokenTypeEmbeddings => format!("{prefix}embeddings.token_type_embeddings.weight"),
            EmbeddingNormWeight => format!("{prefix}embeddings.LayerNorm.weight"),
            EmbeddingNormBias => format!("{prefix}embeddings.LayerNorm.bias"),
            QueryWeight(i) => layer(i, "attention.self.query.weight"),
            QueryBias(i) => layer(i, "attention.self.query.bias"),
            KeyWeight(i) => layer(i, "attention.self.key.weight"),
            KeyBias(i) => layer(i, "attention.self.key.bias"),
            ValueWeight(i) => layer(i, "attention.self.value.weight"),
            ValueBias(i) => layer(i, "attention.self.value.bias"),
            AttnOutWeight(i) => layer(i, "attention.output.dense.weight"),
            AttnOutBias(i) => layer(i, "attention.output.dense.bias"),
            AttnNormWeight(i) => layer(i, "attention.output.LayerNorm.weight"),
            AttnNormBias(i) => layer(i, "attention.output.LayerNorm.bias"),
            FfnUpWeight(i) => layer(i, "intermediate.dense.weight"),
            FfnUpBias(i) => layer(i, "intermediate.dense.bias"),
            FfnDownWeight(i) => layer(i, "output.dense.weight"),
            FfnDownBias(i) => layer(i, "output.dense.bias"),
            FfnNormWeight(i) => layer(i, "output.LayerNorm.weight"),
            FfnNormBias(i) => layer(i, "output.LayerNorm.bias"),
            PoolerWeight => format!("{prefix}pooler.dense.weight"),
            PoolerBias => format!("{prefix}pooler.dense.bias"),
        }
    }
}
