/* MXNet 1.9.1's static memory planner (src/nnvm/plan_memory.cc), over a FlatGraph's
 * decoded steps: the one statement of its rules in mxmirror (memory_plan.simulate_flat
 * calls it; tests/test_fast_paths.py compares it with a literal reading of plan_memory.cc).
 *
 * Per node in execution order: in-place pairs (an input's block taken over by an output of
 * the same size when nothing else reads it, or always for an identity), then the outputs
 * left allocated from a free list matched by size within a factor (the smallest free block
 * at least as large, else the largest smaller one, grown; else a new block), then the
 * blocks of inputs read for the last time are freed, and a new block nobody reads.
 * The free list is a multimap: of equal sizes, a larger block is taken first released first,
 * a smaller one last released first (plan_memory.cc's lower_bound, then --it).
 *
 * Arrays are int64 buffers (numpy arrays, array('q')) or sequences of ints.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BAD (-1)
#define EXTERNAL (-2)

typedef struct {
    Py_buffer view;
    int has_view;
    int64_t *data;
    Py_ssize_t n;
    int64_t *owned;
} I64;

static int get_i64(PyObject *o, I64 *a, const char *what) {
    memset(a, 0, sizeof(*a));
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &a->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
            const char *f = a->view.format ? a->view.format : "B";
            if (*f == '<' || *f == '=' || *f == '@') f++;
            if (a->view.itemsize == 8 && (*f == 'q' || *f == 'l') && f[1] == '\0') {
                a->has_view = 1;
                a->data = (int64_t *)a->view.buf;
                a->n = a->view.len / 8;
                return 0;
            }
            PyBuffer_Release(&a->view);
        } else {
            PyErr_Clear();
        }
    }
    PyObject *seq = PySequence_Fast(o, what);
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    a->owned = (int64_t *)malloc(sizeof(int64_t) * (n ? n : 1));
    if (a->owned == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(a->owned);
            a->owned = NULL;
            return -1;
        }
        a->owned[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    a->data = a->owned;
    a->n = n;
    return 0;
}

static void put_i64(I64 *a) {
    if (a->has_view) PyBuffer_Release(&a->view);
    free(a->owned);
    memset(a, 0, sizeof(*a));
}

/* The free list, MXNet's multimap<size, storage id>: one entry per distinct size (sorted),
 * each a queue of blocks in release order, linked through next/prev by storage id. */
typedef struct {
    int64_t bytes, head, tail;
} Size;

typedef struct {
    Size *sizes;
    Py_ssize_t n, cap;
    int64_t *next, *prev;  /* per storage id */
    char *is_free;         /* per storage id */
} FreeList;

/* first entry whose bytes >= size */
static Py_ssize_t lower_bound(const FreeList *fl, int64_t size) {
    Py_ssize_t lo = 0, hi = fl->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (fl->sizes[mid].bytes < size) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* a released block goes after every block of its size */
static int release(FreeList *fl, int64_t bytes, int64_t sid) {
    if (fl->is_free[sid]) {  /* only facts that work in place on an ignored input do this */
        PyErr_SetString(PyExc_ValueError, "a block released twice");
        return -1;
    }
    fl->is_free[sid] = 1;
    Py_ssize_t at = lower_bound(fl, bytes);
    fl->next[sid] = -1;
    if (at < fl->n && fl->sizes[at].bytes == bytes) {
        Size *z = &fl->sizes[at];
        fl->prev[sid] = z->tail;
        fl->next[z->tail] = sid;
        z->tail = sid;
        return 0;
    }
    if (fl->n == fl->cap) {
        Py_ssize_t cap = fl->cap ? 2 * fl->cap : 64;
        Size *sizes = (Size *)realloc(fl->sizes, sizeof(Size) * cap);
        if (sizes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        fl->sizes = sizes;
        fl->cap = cap;
    }
    memmove(fl->sizes + at + 1, fl->sizes + at, sizeof(Size) * (fl->n - at));
    fl->sizes[at].bytes = bytes;
    fl->sizes[at].head = fl->sizes[at].tail = sid;
    fl->prev[sid] = -1;
    fl->n++;
    return 0;
}

/* take the first released block of entry `at` (a larger block: the multimap's lower bound)
 * or the last released one (a smaller block: the element before it) */
static int64_t take(FreeList *fl, Py_ssize_t at, int last) {
    Size *z = &fl->sizes[at];
    int64_t sid;
    if (last) {
        sid = z->tail;
        z->tail = fl->prev[sid];
        if (z->tail >= 0) fl->next[z->tail] = -1;
    } else {
        sid = z->head;
        z->head = fl->next[sid];
        if (z->head >= 0) fl->prev[z->head] = -1;
    }
    fl->is_free[sid] = 0;
    if (z->head < 0 || z->tail < 0) {  /* that size has no block left */
        memmove(fl->sizes + at, fl->sizes + at + 1, sizeof(Size) * (fl->n - at - 1));
        fl->n--;
    }
    return sid;
}

enum { K_KIND, K_PAIR_OFF, K_PAIRS, K_ALLOC_OFF, K_ALLOCS, K_REL_OFF, K_RELS, K_OUT_BASE,
       K_OUT_N, K_ESIZE, N_PACKED };

static PyObject *simulate(PyObject *self, PyObject *args) {
    PyObject *packed_o, *order_o, *ins_o, *ref_o, *out_o;
    Py_ssize_t n_forward;
    int inplace, want_line;
    long long match_range, stop;
    if (!PyArg_ParseTuple(args, "OOOOOnpLLp", &packed_o, &order_o, &ins_o, &ref_o, &out_o,
                          &n_forward, &inplace, &match_range, &stop, &want_line))
        return NULL;
    if (!PyTuple_Check(packed_o) || PyTuple_GET_SIZE(packed_o) != N_PACKED) {
        PyErr_SetString(PyExc_TypeError, "packed steps: a tuple of 10 int64 arrays");
        return NULL;
    }
    I64 pk[N_PACKED], order, ins, ref, outs;
    int got = 0;
    memset(pk, 0, sizeof(pk));
    memset(&order, 0, sizeof(order));
    memset(&ins, 0, sizeof(ins));
    memset(&ref, 0, sizeof(ref));
    memset(&outs, 0, sizeof(outs));
    PyObject *result = NULL;
    int64_t *storage = NULL, *sref = NULL, *blocks = NULL, *block_live = NULL;
    int64_t *line = NULL;
    char *taken = NULL;
    FreeList fl = {NULL, 0, 0, NULL, NULL, NULL};
    for (; got < N_PACKED; got++)
        if (get_i64(PyTuple_GET_ITEM(packed_o, got), &pk[got], "packed steps") < 0) goto done;
    if (get_i64(order_o, &order, "order") < 0 || get_i64(ins_o, &ins, "ins") < 0
        || get_i64(out_o, &outs, "outputs") < 0)
        goto done;

    const int64_t *kind = pk[K_KIND].data, *pair_off = pk[K_PAIR_OFF].data;
    const int64_t *pairs = pk[K_PAIRS].data, *alloc_off = pk[K_ALLOC_OFF].data;
    const int64_t *allocs = pk[K_ALLOCS].data, *rel_off = pk[K_REL_OFF].data;
    const int64_t *rels = pk[K_RELS].data, *out_base = pk[K_OUT_BASE].data;
    const int64_t *out_n = pk[K_OUT_N].data, *esize = pk[K_ESIZE].data;
    Py_ssize_t n_nodes = pk[K_KIND].n, n_entries = pk[K_ESIZE].n;
    for (Py_ssize_t x = 0; x < ins.n; x++)
        if (ins.data[x] < 0 || ins.data[x] >= n_entries) goto bad_index;
    for (Py_ssize_t k = 0; k < outs.n; k++)
        if (outs.data[k] < 0 || outs.data[k] >= n_entries) goto bad_index;
    for (Py_ssize_t t = 0; t < order.n; t++)
        if (order.data[t] < 0 || order.data[t] >= n_nodes) goto bad_index;
    for (Py_ssize_t r = 0; r < pk[K_RELS].n; r++)
        if (rels[r] < 0 || rels[r] >= ins.n) goto bad_index;
    for (Py_ssize_t p = 0; p < pk[K_PAIRS].n; p += 4)
        if (pairs[p] < 0 || pairs[p] >= ins.n) goto bad_index;
    if (ref_o != Py_None) {
        if (get_i64(ref_o, &ref, "ref") < 0) goto done;
        if (ref.n < n_entries) {
            PyErr_SetString(PyExc_ValueError, "ref: one count per entry");
            goto done;
        }
    } else {  /* the readers that run (counted input slots), and graph outputs */
        ref.owned = (int64_t *)calloc(n_entries + 1, sizeof(int64_t));
        if (ref.owned == NULL) goto no_memory;
        ref.data = ref.owned;
        ref.n = n_entries;
        for (Py_ssize_t t = 0; t < order.n; t++) {
            int64_t i = order.data[t];
            if (kind[i] >= 0)
                for (int64_t r = rel_off[i]; r < rel_off[i + 1]; r++) ref.owned[ins.data[rels[r]]]++;
        }
        for (Py_ssize_t k = 0; k < outs.n; k++) ref.owned[outs.data[k]]++;
    }
    storage = (int64_t *)malloc(sizeof(int64_t) * (n_entries + 1));
    sref = (int64_t *)calloc(n_entries + 1, sizeof(int64_t));
    blocks = (int64_t *)malloc(sizeof(int64_t) * (n_entries + 1));
    block_live = (int64_t *)calloc(n_entries + 1, sizeof(int64_t));
    taken = (char *)malloc(pk[K_PAIRS].n / 4 + 1);
    fl.next = (int64_t *)malloc(sizeof(int64_t) * (n_entries + 1));
    fl.prev = (int64_t *)malloc(sizeof(int64_t) * (n_entries + 1));
    fl.is_free = (char *)calloc(n_entries + 1, 1);
    if (want_line) line = (int64_t *)malloc(sizeof(int64_t) * (order.n + 1));
    if (!storage || !sref || !blocks || !block_live || !taken || !fl.next || !fl.prev
        || !fl.is_free
        || (want_line && !line)) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t e = 0; e < n_entries; e++) storage[e] = BAD;
    for (Py_ssize_t k = n_forward; k < outs.n; k++)  /* argument gradients */
        storage[outs.data[k]] = EXTERNAL;
    int64_t n_blocks = 0, total = 0, live = 0;
    int64_t mr = match_range;
    Py_ssize_t n_line = 0;
    for (Py_ssize_t t = 0; t < order.n; t++) {
        int64_t i = order.data[t];
        if (kind[i] < 0) {  /* a variable: nothing planned here */
            if (want_line) line[n_line++] = 0;
            continue;
        }
        int ignore_all = (int)(kind[i] & 1), unread = 0;
        if (inplace) {
            for (int64_t p = pair_off[i]; p < pair_off[i + 1]; p++) {
                const int64_t *pr = pairs + 4 * p;
                int64_t x = pr[0], eo = pr[1], out_size = pr[2], identity = pr[3];
                int64_t ei = ins.data[x], sid_in = storage[ei];
                int seen = 0;  /* an input slot gives its block to one output at most */
                for (int64_t q = pair_off[i]; q < p; q++) seen |= taken[q] && pairs[4 * q] == x;
                taken[p] = 0;
                if (sid_in >= 0 && out_size == esize[ei] && storage[eo] == BAD
                    && ref.data[eo] > 0 && ((sref[sid_in] == 1 && !ignore_all) || identity)
                    && !seen) {
                    taken[p] = 1;
                    storage[eo] = sid_in;
                    sref[sid_in] += ref.data[eo];
                }
            }
        }
        for (int64_t a = alloc_off[i]; a < alloc_off[i + 1]; a++) {
            int64_t eo = allocs[2 * a], size = allocs[2 * a + 1];
            if (storage[eo] != BAD) continue;
            int64_t sid = -1;
            if (mr) {
                Py_ssize_t mid = lower_bound(&fl, size);
                if (mid < fl.n && fl.sizes[mid].bytes <= size * mr)
                    sid = take(&fl, mid, 0);
                else if (mid && fl.sizes[mid - 1].bytes >= size / mr)
                    sid = take(&fl, mid - 1, 1);
            }
            if (sid < 0) {
                sid = n_blocks++;
                blocks[sid] = size;
                total += size;
                if (stop >= 0 && total >= stop) {
                    result = Py_None;
                    Py_INCREF(result);
                    goto done;
                }
            } else if (size > blocks[sid]) {
                total += size - blocks[sid];
                blocks[sid] = size;
                if (stop >= 0 && total >= stop) {
                    result = Py_None;
                    Py_INCREF(result);
                    goto done;
                }
            }
            storage[eo] = sid;
            sref[sid] = ref.data[eo];
            if (!sref[sid]) unread = 1;
            if (want_line) {
                block_live[sid] = blocks[sid];
                live += blocks[sid];
            }
        }
        for (int64_t r = rel_off[i]; r < rel_off[i + 1]; r++) {
            int64_t sid = storage[ins.data[rels[r]]];
            if (sid >= 0 && !--sref[sid]) {
                if (release(&fl, blocks[sid], sid) < 0) goto done;
                live -= block_live[sid];
                block_live[sid] = 0;
            }
        }
        if (unread) {  /* only a new block of an unread output is free at once */
            for (int64_t eo = out_base[i]; eo < out_base[i] + out_n[i]; eo++) {
                int64_t sid = storage[eo];
                if (sid >= 0 && !sref[sid]) {
                    if (release(&fl, blocks[sid], sid) < 0) goto done;
                    live -= block_live[sid];
                    block_live[sid] = 0;
                }
            }
        }
        if (want_line) line[n_line++] = live;
    }
    {
        PyObject *st = PyBytes_FromStringAndSize((const char *)storage,
                                                 (Py_ssize_t)(sizeof(int64_t) * n_entries));
        PyObject *bl = PyList_New((Py_ssize_t)n_blocks);
        PyObject *ln = want_line ? PyList_New(n_line) : PyList_New(0);
        if (!st || !bl || !ln) {
            Py_XDECREF(st);
            Py_XDECREF(bl);
            Py_XDECREF(ln);
            goto done;
        }
        for (int64_t b = 0; b < n_blocks; b++)
            PyList_SET_ITEM(bl, (Py_ssize_t)b, PyLong_FromLongLong(blocks[b]));
        for (Py_ssize_t k = 0; k < n_line; k++)
            PyList_SET_ITEM(ln, k, PyLong_FromLongLong(line[k]));
        result = Py_BuildValue("(LNNN)", (long long)total, st, bl, ln);
    }
    goto done;
bad_index:
    PyErr_SetString(PyExc_IndexError, "node or entry index out of range");
    goto done;
no_memory:
    PyErr_NoMemory();
done:
    for (int k = 0; k < N_PACKED; k++) put_i64(&pk[k]);
    put_i64(&order);
    put_i64(&ins);
    put_i64(&ref);
    put_i64(&outs);
    free(storage);
    free(sref);
    free(blocks);
    free(block_live);
    free(line);
    free(taken);
    free(fl.sizes);
    free(fl.next);
    free(fl.prev);
    free(fl.is_free);
    return result;
}


/* ------------------------------------------------------------------ resolving a mirror set
 * compiled.CompiledTraining's integer training graph resolved for one mirror set (its flat()
 * states the rule; this is it, compiled): the mirror-independent DFS's runs of nodes, each
 * followed by the switches met after it; where a met switch's source is mirrored (and its
 * condition node too, if it has one) and its copy not yet placed, the copy's own DFS places
 * the copies of its mirrored inputs first, then the copy. Each switch then reads the copy or
 * the original; reference counts are the static ones plus the switches' and the placed
 * copies' reads. */
enum { R_RUN_OFF, R_RUN_NODES, R_MET_OFF, R_MET_COND, R_MET_SRC, R_SRC_OFF, R_SRC_LIST,
       R_COPY, R_MIRRORABLE, R_SW_COND, R_SW_SRC, R_SW_ORIG, R_SW_COPIED, R_INDEX_MAP,
       R_REF_STATIC, R_COUNTED, R_COPY_SW, R_COPY_SW_OF, R_COPY_ENT, R_COPY_ENT_OF, N_RESOLVE };

static PyObject *resolve(PyObject *self, PyObject *args) {
    PyObject *packed_o, *mirror_o;
    Py_ssize_t n_entries, n_compiled;
    if (!PyArg_ParseTuple(args, "OOnn", &packed_o, &mirror_o, &n_entries, &n_compiled))
        return NULL;
    if (!PyTuple_Check(packed_o) || PyTuple_GET_SIZE(packed_o) != N_RESOLVE) {
        PyErr_SetString(PyExc_TypeError, "packed training graph: a tuple of 20 int64 arrays");
        return NULL;
    }
    I64 pk[N_RESOLVE], mirror;
    memset(pk, 0, sizeof(pk));
    memset(&mirror, 0, sizeof(mirror));
    PyObject *result = NULL;
    char *mir = NULL, *pending = NULL, *made_mask = NULL;
    int64_t *order = NULL, *made = NULL, *stack = NULL, *next = NULL, *read = NULL;
    int64_t *ins = NULL, *ref = NULL;
    for (int k = 0; k < N_RESOLVE; k++)
        if (get_i64(PyTuple_GET_ITEM(packed_o, k), &pk[k], "packed training graph") < 0)
            goto done;
    if (get_i64(mirror_o, &mirror, "mirror set") < 0) goto done;
    Py_ssize_t n_graph = pk[R_COPY].n, n_runs = pk[R_RUN_OFF].n - 1;
    Py_ssize_t n_switch = pk[R_SW_COND].n, n_slots = pk[R_INDEX_MAP].n;
    const int64_t *run_off = pk[R_RUN_OFF].data, *run_nodes = pk[R_RUN_NODES].data;
    const int64_t *met_off = pk[R_MET_OFF].data, *met_cond = pk[R_MET_COND].data;
    const int64_t *met_src = pk[R_MET_SRC].data, *src_off = pk[R_SRC_OFF].data;
    const int64_t *src_list = pk[R_SRC_LIST].data, *copy = pk[R_COPY].data;
    const int64_t *mirrorable = pk[R_MIRRORABLE].data;
    const int64_t *sw_cond = pk[R_SW_COND].data, *sw_src = pk[R_SW_SRC].data;
    const int64_t *sw_orig = pk[R_SW_ORIG].data, *sw_copied = pk[R_SW_COPIED].data;
    const int64_t *index_map = pk[R_INDEX_MAP].data, *ref_static = pk[R_REF_STATIC].data;
    {  /* every index in range: a bad table fails here, not in memory */
        struct { int k; Py_ssize_t below; int minus_one; } checks[] = {
            {R_RUN_NODES, n_compiled, 0}, {R_MET_SRC, n_graph, 0}, {R_MET_COND, n_graph, 1},
            {R_SRC_LIST, n_graph, 0}, {R_COPY, n_compiled, 1}, {R_SW_COND, n_graph, 1},
            {R_SW_SRC, n_graph, 0}, {R_SW_ORIG, n_entries, 0}, {R_SW_COPIED, n_entries, 1},
            {R_INDEX_MAP, n_entries + n_switch, 0}, {R_COUNTED, n_switch, 0},
            {R_COPY_SW, n_switch, 0}, {R_COPY_SW_OF, n_compiled, 0},
            {R_COPY_ENT, n_entries, 0}, {R_COPY_ENT_OF, n_compiled, 0}};
        for (size_t c = 0; c < sizeof(checks) / sizeof(checks[0]); c++)
            for (Py_ssize_t k = 0; k < pk[checks[c].k].n; k++) {
                int64_t v = pk[checks[c].k].data[k];
                if (v >= checks[c].below || v < (checks[c].minus_one ? -1 : 0)) goto bad;
            }
        const int k_off[] = {R_RUN_OFF, R_MET_OFF, R_SRC_OFF};
        const int k_of[] = {R_RUN_NODES, R_MET_COND, R_SRC_LIST};
        for (int c = 0; c < 3; c++) {
            const I64 *off = &pk[k_off[c]];
            if (off->n < 1 || off->data[0] != 0 || off->data[off->n - 1] > pk[k_of[c]].n)
                goto bad;
            for (Py_ssize_t k = 1; k < off->n; k++)
                if (off->data[k] < off->data[k - 1]) goto bad;
        }
        if (pk[R_MET_OFF].n != pk[R_RUN_OFF].n || pk[R_SRC_OFF].n != n_graph + 1
            || pk[R_MET_SRC].n != pk[R_MET_COND].n || pk[R_MIRRORABLE].n != n_graph
            || pk[R_REF_STATIC].n != n_entries || pk[R_SW_SRC].n != n_switch
            || pk[R_SW_ORIG].n != n_switch || pk[R_SW_COPIED].n != n_switch
            || pk[R_COPY_SW_OF].n != pk[R_COPY_SW].n || pk[R_COPY_ENT_OF].n != pk[R_COPY_ENT].n)
            goto bad;
    }
    mir = (char *)calloc(n_graph + 1, 1);
    pending = (char *)calloc(n_graph + 1, 1);
    made_mask = (char *)calloc(n_compiled + 1, 1);
    order = (int64_t *)malloc(sizeof(int64_t) * (n_compiled + 1));
    made = (int64_t *)malloc(sizeof(int64_t) * (n_graph + 1));
    stack = (int64_t *)malloc(sizeof(int64_t) * (n_graph + 1));
    next = (int64_t *)malloc(sizeof(int64_t) * (n_graph + 1));
    read = (int64_t *)malloc(sizeof(int64_t) * (n_switch + 1));
    ins = (int64_t *)malloc(sizeof(int64_t) * (n_slots + 1));
    ref = (int64_t *)malloc(sizeof(int64_t) * (n_entries + 1));
    if (!mir || !pending || !made_mask || !order || !made || !stack || !next || !read || !ins
        || !ref) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < mirror.n; k++) {
        int64_t g = mirror.data[k];
        if (g >= 0 && g < n_graph && mirrorable[g]) mir[g] = pending[g] = 1;
    }
    Py_ssize_t n_order = 0, n_made = 0;
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        for (int64_t t = run_off[r]; t < run_off[r + 1]; t++) {
            if (n_order >= n_compiled) goto bad;
            order[n_order++] = run_nodes[t];
        }
        for (int64_t t = met_off[r]; t < met_off[r + 1]; t++) {
            int64_t cond = met_cond[t], src = met_src[t];
            if (!pending[src] || (cond >= 0 && !mir[cond])) continue;
            pending[src] = 0;
            Py_ssize_t depth = 0;
            stack[depth] = src;
            next[depth++] = src_off[src];
            while (depth) {  /* the copy's own DFS: copies of its mirrored inputs first */
                int64_t g = stack[depth - 1], pushed = 0;
                while (next[depth - 1] < src_off[g + 1]) {
                    int64_t s = src_list[next[depth - 1]++];
                    if (pending[s]) {
                        pending[s] = 0;
                        stack[depth] = s;
                        next[depth++] = src_off[s];
                        pushed = 1;
                        break;
                    }
                }
                if (pushed) continue;
                depth--;
                if (n_order >= n_compiled || copy[g] < 0) goto bad;
                order[n_order++] = copy[g];
                made[n_made++] = g;
                made_mask[copy[g]] = 1;
            }
        }
    }
    for (Py_ssize_t w = 0; w < n_switch; w++) {
        int on = mir[sw_src[w]] && (sw_cond[w] < 0 || mir[sw_cond[w]]);
        read[w] = on ? sw_copied[w] : sw_orig[w];
    }
    for (Py_ssize_t x = 0; x < n_slots; x++) {
        int64_t v = index_map[x];
        ins[x] = v < n_entries ? v : read[v - n_entries];
    }
    memcpy(ref, ref_static, sizeof(int64_t) * n_entries);
    for (Py_ssize_t k = 0; k < pk[R_COUNTED].n; k++) ref[read[pk[R_COUNTED].data[k]]]++;
    for (Py_ssize_t k = 0; k < pk[R_COPY_SW].n; k++)
        if (made_mask[pk[R_COPY_SW_OF].data[k]]) ref[read[pk[R_COPY_SW].data[k]]]++;
    for (Py_ssize_t k = 0; k < pk[R_COPY_ENT].n; k++)
        if (made_mask[pk[R_COPY_ENT_OF].data[k]]) ref[pk[R_COPY_ENT].data[k]]++;
    {
        PyObject *o = PyBytes_FromStringAndSize((const char *)order, sizeof(int64_t) * n_order);
        PyObject *m = PyList_New(n_made);
        PyObject *i = PyBytes_FromStringAndSize((const char *)ins, sizeof(int64_t) * n_slots);
        PyObject *f = PyBytes_FromStringAndSize((const char *)ref, sizeof(int64_t) * n_entries);
        if (!o || !m || !i || !f) {
            Py_XDECREF(o);
            Py_XDECREF(m);
            Py_XDECREF(i);
            Py_XDECREF(f);
            goto done;
        }
        for (Py_ssize_t k = 0; k < n_made; k++)
            PyList_SET_ITEM(m, k, PyLong_FromLongLong(made[k]));
        result = Py_BuildValue("(NNNN)", o, m, i, f);
    }
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "packed training graph: inconsistent");
done:
    for (int k = 0; k < N_RESOLVE; k++) put_i64(&pk[k]);
    put_i64(&mirror);
    free(mir);
    free(pending);
    free(made_mask);
    free(order);
    free(made);
    free(stack);
    free(next);
    free(read);
    free(ins);
    free(ref);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS,
     "simulate(packed, order, ins, ref or None, outputs, num_forward_outputs, inplace,"
     " match_range, stop_at, timeline) (match_range 0: no sharing; ref None: counted here)"
     " -> (total bytes, storage as int64 bytes, block bytes, timeline) or None once the"
     " blocks reach stop_at (>= 0)"},
    {"resolve", resolve, METH_VARARGS,
     "resolve(packed, mirror ids, entries, compiled nodes) -> (order, copies made (graph"
     " ids, in order), ins, ref): order, ins and ref as int64 bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planner",
                                    "MXNet 1.9.1's static memory planner, compiled.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__planner(void) { return PyModule_Create(&module); }
