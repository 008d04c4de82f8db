// llama.cpp b1-0c1e570's ngram-cache (common/ngram-cache.cpp, compiled in beside this file) driven
// by a script, for scripts/record_ngram_cache_reference.py: what tritium's runtime/serving/ngram_cache.py
// must reproduce (drafts, files byte for byte, libstdc++'s map growth).
//   ngram_cache_ref growth            -> the bucket counts a std::unordered_map grows through
//   ngram_cache_ref run SCRIPT        -> one output line per command of SCRIPT ("-": stdin, answered line by line):
//     create_static PATH T...         common_ngram_cache_update(2, 2) of T..., saved (llama-lookup-create)
//     create_full PATH T...           common_ngram_cache_update(1, 4) of T..., saved
//     dump PATH                       load PATH; print "ngram t0 t1 t2 t3 : tok count ..." sorted
//     resave A B                      load A, save it as B (the map's order after a load differs)
//     bytes_equal A B                 1 when files A and B hold the same bytes
//     spec N_SEQ STATIC DYNAMIC       a common_speculative_impl_ngram_cache over N_SEQ slots ("-": no file)
//     draft SEQ ID_LAST T...          its draft_one for slot SEQ with prompt T... (prints the draft)
// Only ngram-cache.cpp's own code decides; draft_one is speculative.cpp's, copied line for line.
#include "ngram-cache.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using llama_tokens = std::vector<llama_token>;

// the few symbols ngram-cache.cpp links against, from ggml / common's log
extern "C" int64_t ggml_time_ms(void) { return 0; }
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "GGML_ABORT %s:%d: ", file, line);
    va_list ap; va_start(ap, fmt); vfprintf(stderr, fmt, ap); va_end(ap);
    fprintf(stderr, "\n");
    abort();
}
int common_log_get_verbosity_thold(void) { return -1; }
struct common_log;
struct common_log * common_log_main() { return nullptr; }
void common_log_add(struct common_log *, enum ggml_log_level, const char *, ...) {}

struct seq_info {
    size_t cache_size = 0;
    common_ngram_cache ngram_cache_context;
    common_ngram_cache ngram_cache_dynamic;
    common_ngram_cache ngram_cache_static;
};

static std::vector<llama_token> read_tokens(std::istringstream & in) {
    std::vector<llama_token> v;
    llama_token t;
    while (in >> t) v.push_back(t);
    return v;
}

int main(int argc, char ** argv) {
    if (argc >= 2 && std::string(argv[1]) == "growth") {
        // observed while emplacing 2^20 keys, then libstdc++'s own policy (_M_next_bkt of twice the count)
        std::unordered_map<int, int> m;
        size_t last = m.bucket_count();
        for (int i = 0; i < (1 << 20); ++i) {
            m.emplace(i, 0);
            if (m.bucket_count() != last) { last = m.bucket_count(); printf("%zu\n", last); }
        }
        std::__detail::_Prime_rehash_policy pol;
        while (last < (size_t) 1 << 36) { last = pol._M_next_bkt(2 * last); printf("%zu\n", last); }
        return 0;
    }
    if (argc < 3) { fprintf(stderr, "usage: %s growth | run SCRIPT\n", argv[0]); return 2; }
    std::ifstream file;
    if (std::string(argv[2]) != "-") file.open(argv[2]);
    std::istream & script = std::string(argv[2]) == "-" ? std::cin : file;
    std::vector<seq_info> sinfos;
    std::string line;
    while (std::getline(script, line)) {
        fflush(stdout);
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "create_static" || cmd == "create_full") {
            std::string path; in >> path;
            auto toks = read_tokens(in);
            common_ngram_cache c;
            if (cmd == "create_static") {
                common_ngram_cache_update(c, LLAMA_NGRAM_STATIC, LLAMA_NGRAM_STATIC, toks, toks.size(), false);
            } else {
                common_ngram_cache_update(c, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, toks, toks.size(), false);
            }
            common_ngram_cache_save(c, path);
            printf("saved %zu\n", c.size());
        } else if (cmd == "dump") {
            std::string path; in >> path;
            common_ngram_cache c = common_ngram_cache_load(path);
            std::vector<std::string> rows;
            for (auto & kv : c) {
                std::ostringstream o;
                o << kv.first.tokens[0] << ' ' << kv.first.tokens[1] << ' ' << kv.first.tokens[2] << ' ' << kv.first.tokens[3] << " :";
                std::vector<std::pair<int, int>> p(kv.second.begin(), kv.second.end());
                std::sort(p.begin(), p.end());
                for (auto & tc : p) o << ' ' << tc.first << ' ' << tc.second;
                rows.push_back(o.str());
            }
            std::sort(rows.begin(), rows.end());
            printf("dump %zu", rows.size());
            for (auto & r : rows) printf(" | %s", r.c_str());
            printf("\n");
        } else if (cmd == "resave") {
            std::string a, b; in >> a >> b;
            common_ngram_cache c = common_ngram_cache_load(a);
            common_ngram_cache_save(c, b);
            printf("saved %zu\n", c.size());
        } else if (cmd == "bytes_equal") {
            std::string a, b; in >> a >> b;
            std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
            std::string sa((std::istreambuf_iterator<char>(fa)), {}), sb((std::istreambuf_iterator<char>(fb)), {});
            printf("%d\n", (int) (sa == sb));
        } else if (cmd == "spec") {
            int n_seq; std::string ps, pd; in >> n_seq >> ps >> pd;
            sinfos.assign(n_seq, seq_info());
            if (ps != "-") { auto c = common_ngram_cache_load(ps); for (auto & s : sinfos) s.ngram_cache_static = c; }
            if (pd != "-") { auto c = common_ngram_cache_load(pd); for (auto & s : sinfos) s.ngram_cache_dynamic = c; }
            printf("spec\n");
        } else if (cmd == "draft") {
            int seq_id; llama_token id_last; in >> seq_id >> id_last;
            const llama_tokens prompt = read_tokens(in);
            const uint16_t n_draft = 8;
            // common_speculative_impl_ngram_cache::draft_one
            auto & sinfo = sinfos[seq_id];
            llama_tokens result;
            if (sinfo.cache_size < prompt.size() + 1) {
                llama_tokens tokens_new;
                tokens_new.reserve(prompt.size() + 1 - sinfo.cache_size);
                for (size_t j = sinfo.cache_size; j < prompt.size(); ++j) {
                    tokens_new.push_back(prompt[j]);
                }
                tokens_new.push_back(id_last);
                common_ngram_cache_update(sinfo.ngram_cache_context, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX,
                        tokens_new, tokens_new.size(), false);
                sinfo.cache_size = prompt.size() + 1;
            }
            llama_tokens inp;
            inp.reserve(prompt.size() + 1);
            for (size_t j = 0; j < prompt.size(); ++j) {
                inp.push_back(prompt[j]);
            }
            inp.push_back(id_last);
            result.push_back(id_last);
            common_ngram_cache_draft(inp, result, n_draft, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX,
                    sinfo.ngram_cache_context, sinfo.ngram_cache_dynamic, sinfo.ngram_cache_static);
            if (result.size() > 0) {
                result.erase(result.begin());
            }
            printf("draft");
            for (auto t : result) printf(" %d", t);
            printf("\n");
        } else if (!cmd.empty()) {
            fprintf(stderr, "unknown command %s\n", cmd.c_str());
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
