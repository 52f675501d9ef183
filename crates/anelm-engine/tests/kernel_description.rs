//! The planner and the loader read one description of each model, so they cannot drift: for a
//! small model of every architecture (Llama, Qwen3, Qwen3.5 from safetensors and from GGUF,
//! Gemma 3; SmolLM2 and Gemma 3 270M GGUF too when fetched), the kernels loading compiles —
//! recorded by a backend that reads each weight's stored shape — equal, kernel for kernel, the
//! list `anelm plan` plans from the config alone (`plan_dims::model_kernels`). And that list
//! equals what `anelm_ane::ModelDims::kernels` derives from the shapes alone, the derivation the
//! planner's own tests and calibration table use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anelm_ane::{AneKernel, PlanOptions, plan_encoder_kernels};
use anelm_engine::arch::bert::BertConfig;
use anelm_engine::backend::{Backend, Kernel, KernelShape, KernelSpec, WeightId};
use anelm_engine::default_model::{DEFAULT_MODEL_FILE, cache_dir};
use anelm_engine::plan_dims::{encoder_kernels, model_dims, model_kernels};
use anelm_engine::{Batch, Dispatch, Embedder, EngineError, Result, load_model_weights};
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;

/// Records the shape of every kernel a model compiles, from the stored weights' shapes, and
/// hands back a kernel of that shape that does not run.
#[derive(Default)]
struct Recording {
    seen: Mutex<Vec<AneKernel>>,
}

struct Stub(KernelShape);

impl Kernel for Stub {
    fn shape(&self) -> KernelShape {
        self.0
    }
    fn run(&self, _: &[&Batch], _: &mut Batch) -> Result<Dispatch> {
        Err(EngineError::Backend {
            backend: "recording".into(),
            message: "a recorded kernel does not run".into(),
        })
    }
}

/// `[rows, cols]` of a stored matrix.
fn stored(store: &Arc<dyn TensorStore>, w: &WeightId) -> Result<(usize, usize)> {
    let view = store.tensor(&w.0)?;
    match view.shape.as_slice() {
        [r, c] => Ok((*r, *c)),
        other => Err(EngineError::Config(format!("{} has shape {other:?}", w.0))),
    }
}

impl Backend for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn max_lanes(&self) -> usize {
        32
    }
    fn compile(&self, spec: &KernelSpec, store: &Arc<dyn TensorStore>) -> Result<Box<dyn Kernel>> {
        let kernel = match spec {
            KernelSpec::Linear { w } => {
                let (rows, cols) = stored(store, w)?;
                AneKernel::Linear { rows, cols }
            }
            KernelSpec::LmHead { w } => {
                let (rows, cols) = stored(store, w)?;
                AneKernel::LmHeadChunk { rows, cols }
            }
            KernelSpec::LinearResidual { w } => {
                let (rows, cols) = stored(store, w)?;
                AneKernel::LinearResidual { rows, cols }
            }
            KernelSpec::Concat { ws } => {
                let shapes = ws.iter().map(|w| stored(store, w)).collect::<Result<Vec<_>>>()?;
                let cols = shapes[0].1;
                assert!(shapes.iter().all(|s| s.1 == cols), "concat of unequal widths: {spec:?}");
                AneKernel::FusedLinear {
                    parts: shapes.iter().map(|s| s.0).collect(),
                    cols,
                }
            }
            KernelSpec::SwiGluResidual { gate, up, down } => {
                let (inter, hidden) = stored(store, gate)?;
                assert_eq!(stored(store, up)?, (inter, hidden), "{spec:?}");
                assert_eq!(stored(store, down)?, (hidden, inter), "{spec:?}");
                AneKernel::SwiGluFfnResidual { hidden, inter }
            }
            KernelSpec::SwiGluAccumulate { .. } => panic!("a decoder compiles no FFN chunk itself: {spec:?}"),
        };
        let shape = KernelShape {
            input: kernel.input_channels()[0],
            output: kernel.output_channels(),
        };
        self.seen.lock().expect("lock").push(kernel);
        Ok(Box::new(Stub(shape)))
    }
}

/// The kernels loading `path` compiles, in order, and the planner's kernels for its config.
fn compiled_and_planned(path: &Path) -> (Vec<AneKernel>, Vec<AneKernel>) {
    let rec = Recording::default();
    load_model_weights(path, &rec, &mut |_, _| {}).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let compiled = rec.seen.into_inner().expect("lock");
    let described = model_kernels(path).unwrap_or_else(|e| panic!("describe {}: {e}", path.display()));
    let planned: Vec<AneKernel> = (described.layers.iter())
        .flat_map(|l| l.kernels.iter().map(|k| k.kernel.clone()))
        .chain([described.lm_head.kernel.clone()])
        .collect();
    // The planner's hand derivation (its tests, the calibration table) agrees too, given the
    // layers' kinds — where the file stores q, k and v apart (Phi-3's fuses them into one
    // matrix, which the shapes alone cannot know: the same rows in one part instead of three).
    let dims = model_dims(path).expect("dims");
    let kinds: Vec<_> = described.layers.iter().map(|l| l.kind).collect();
    let derived = dims.kernels(&kinds);
    if path.ends_with("phi3") {
        assert_eq!(described.layers.len(), derived.layers.len());
        for (d, h) in described.layers.iter().zip(&derived.layers) {
            assert_eq!(
                d.kernels[1..],
                h.kernels[1..],
                "{}: all but the fused q ‖ k ‖ v",
                path.display()
            );
            assert_eq!(
                d.kernels[0].kernel.output_channels(),
                h.kernels[0].kernel.output_channels(),
                "{}: the fused projection has the q, k and v rows",
                path.display()
            );
        }
    } else {
        assert_eq!(described, derived, "{}: ModelDims::kernels", path.display());
    }
    (compiled, planned)
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

#[test]
fn every_architecture_compiles_what_the_planner_plans() {
    for rel in [
        "hf/llama",
        "hf/qwen2",
        "hf/phi3",
        "hf/qwen3",
        "hf/lfm2",
        "hf/qwen3_5",
        "hf/qwen3_5_text",
        "hf/gemma3",
        "gguf/qwen3_5.gguf",
        "gguf/qwen3_5_text.gguf",
    ] {
        let (compiled, planned) = compiled_and_planned(&fixture(rel));
        assert!(compiled.len() >= 4, "{rel}: {} kernels", compiled.len());
        assert_eq!(compiled, planned, "{rel}");
    }
}

#[test]
fn fetched_gguf_models_compile_what_the_planner_plans() {
    let models = cache_dir().map(|d| d.join("models")).expect("a model cache directory");
    for file in [DEFAULT_MODEL_FILE, "gemma-3-270m-q4_k_m.gguf"] {
        let path = models.join(file);
        assert!(
            path.is_file(),
            "{} is missing: run scripts/fetch-default-model.sh and scripts/fetch-gemma3.sh (scripts/test.sh does)",
            path.display()
        );
        let (compiled, planned) = compiled_and_planned(&path);
        assert!(compiled.len() > 30, "{file}: {} kernels", compiled.len());
        assert_eq!(compiled, planned, "{file}");
    }
}

#[test]
fn a_layer_the_planner_would_describe_differently_is_caught() {
    // The check is not vacuous: a description with one kernel's shape changed differs.
    let path = fixture("hf/qwen3_5_text");
    let (compiled, mut planned) = compiled_and_planned(&path);
    if let Some(AneKernel::FusedLinear { parts, .. }) = planned.first_mut() {
        parts[0] += 1;
    }
    assert_ne!(compiled, planned);
}

#[test]
fn the_bert_encoder_compiles_what_the_encoder_planner_plans() {
    let Some(dir) = cache_dir().map(|d| d.join("models/all-MiniLM-L6-v2")) else {
        return;
    };
    assert!(
        dir.is_dir(),
        "{} is missing: run scripts/fetch-minilm.sh (scripts/test.sh does)",
        dir.display()
    );
    let rec = Recording::default();
    Embedder::load(&dir, &rec).expect("load all-MiniLM-L6-v2");
    let compiled = rec.seen.into_inner().expect("lock");
    let c = BertConfig::from_hf(&HfConfig::from_file(&dir.join("config.json")).expect("config")).expect("bert");
    // What `anelm plan` plans: the description's layer, which the shapes-only derivation matches.
    let (dims, layer) = encoder_kernels(&c).expect("encoder kernels");
    assert_eq!(layer, dims.kernels());
    let plan = plan_encoder_kernels(&dims, &layer, &PlanOptions::default()).expect("plan");
    let planned: Vec<AneKernel> = (0..dims.layers)
        .flat_map(|_| plan.layer.iter().map(|k| k.kernel.clone()))
        .collect();
    assert_eq!(compiled.len(), 4 * 6);
    assert_eq!(compiled, planned);
}
