// Records llama.cpp's greedy continuation of raw prompts, with the two most likely tokens and
// their log-probabilities at every generated position. Built and driven by
// scripts/make-llamacpp-fixtures.sh, which turns this program's output into the JSON fixtures
// under fixtures/llamacpp/. Written for the llama.cpp vendored in llama-cpp-python 0.3.36.
//
// usage: greedy MODEL.gguf N_PREDICT THREADS PROMPTS_FILE
//   PROMPTS_FILE holds one prompt per line, hex-encoded UTF-8 (prompts contain newlines).
// output, per prompt:
//   P <prompt token ids...>                  (tokenized with the BOS the model asks for,
//                                             special tokens parsed as special)
//   S <id1> <logprob1> <id2> <logprob2>      (once per generated token; id1 is the one taken)
//   X <hex of the completion's detokenized text>
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static std::string unhex(const std::string & h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::strtol(h.substr(i, 2).c_str(), nullptr, 16)));
    }
    return out;
}

// llama.cpp's log, errors only (why a model does not load).
static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT|embed THREADS PROMPTS_FILE\n", argv[0]);
        return 2;
    }
    // `embed`: an embedding model's pooled vector per prompt instead of greedy tokens.
    const bool embed = std::string(argv[2]) == "embed";
    const int n_predict = embed ? 0 : std::atoi(argv[2]);
    const int threads = std::atoi(argv[3]);
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "error: llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::ifstream prompts(argv[4]);
    std::string line;
    while (std::getline(prompts, line)) {
        if (line.empty()) continue;
        const std::string prompt = unhex(line);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 1024;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        if (embed) {
            // The pooling the GGUF's metadata names; the whole prompt in one batch.
            cp.embeddings = true;
            cp.n_ubatch = 1024;
        }
        // Flash attention stays at llama.cpp's default (auto: on for the CPU backend).
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            std::fprintf(stderr, "error: could not create a context\n");
            return 1;
        }
        std::vector<llama_token> ids(prompt.size() + 8);
        const int n = llama_tokenize(vocab, prompt.data(), (int) prompt.size(), ids.data(), (int) ids.size(), true, true);
        if (n < 0) {
            std::fprintf(stderr, "error: tokenization failed\n");
            return 1;
        }
        ids.resize(n);
        std::printf("P");
        for (llama_token t : ids) std::printf(" %d", t);
        std::printf("\n");
        std::vector<llama_token> out;
        llama_batch batch = llama_batch_get_one(ids.data(), (int) ids.size());
        if (embed) {
            // As llama.cpp's embedding example runs an encoder-only model: one decode.
            if (llama_decode(ctx, batch) != 0) {
                std::fprintf(stderr, "error: llama_decode failed\n");
                return 1;
            }
            const float * e = llama_get_embeddings_seq(ctx, 0);
            if (!e) {
                std::fprintf(stderr, "error: no pooled embedding (the GGUF names no pooling type)\n");
                return 1;
            }
            std::printf("E");
            for (int i = 0; i < llama_model_n_embd_out(model); ++i) std::printf(" %.9g", (double) e[i]);
            std::printf("\n");
            std::fflush(stdout);
            llama_free(ctx);
            continue;
        }
        llama_token next = 0;
        for (int step = 0; step < n_predict; ++step) {
            if (llama_decode(ctx, batch) != 0) {
                std::fprintf(stderr, "error: llama_decode failed at step %d\n", step);
                return 1;
            }
            const float * logits = llama_get_logits_ith(ctx, -1);
            int best = 0, second = -1;
            for (int i = 1; i < n_vocab; ++i) {
                if (logits[i] > logits[best]) {
                    second = best;
                    best = i;
                } else if (second < 0 || logits[i] > logits[second]) {
                    second = i;
                }
            }
            if (second < 0) second = best == 0 ? 1 : 0;
            // log-softmax in float32, as the value a float32 logit vector gives.
            const float max = logits[best];
            double sum = 0.0;
            for (int i = 0; i < n_vocab; ++i) sum += std::exp((double) (logits[i] - max));
            const float log_sum = (float) std::log(sum);
            const float lp1 = (logits[best] - max) - log_sum;
            const float lp2 = (logits[second] - max) - log_sum;
            std::printf("S %d %.17g %d %.17g\n", best, (double) lp1, second, (double) lp2);
            next = best;
            out.push_back(next);
            batch = llama_batch_get_one(&next, 1);
        }
        std::vector<char> text(out.size() * 64 + 64);
        int len = llama_detokenize(vocab, out.data(), (int) out.size(), text.data(), (int) text.size(), false, false);
        if (len < 0) len = 0;
        std::printf("X ");
        for (int i = 0; i < len; ++i) std::printf("%02x", (unsigned char) text[i]);
        std::printf("\n");
        std::fflush(stdout);
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
