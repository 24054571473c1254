/* The multi-level DP's table (planning/dp.py, Table), compiled: it is O(m^3 x levels).
 *
 * cost[s, e, M]: the least forward work that backpropagates segments s+1..e from the state
 * at cut s with at most M memory levels of further kept states; arg[s, e, M] the chosen mid.
 * A leaf (s, s+1) costs its segment's FLOPs. Otherwise, over mid in s+1..e-1 (the first of
 * equal minima wins, as numpy's argmin): advance s -> mid (prefix[mid] - prefix[s]), solve
 * (mid, e) with M - bu[mid], then (s, mid) with M; infeasible where the running peak of kept
 * pairs (bu[mid] + bu[mid - 1], the first mid alone) exceeds M or M < bu[mid].
 * The sum is formed as (advance + right) + left, in double, as the numpy statement did.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int buffer_of(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *fmt,
                     const char *what) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (v->itemsize != itemsize || strchr(fmt, *f) == NULL || f[1] != '\0') {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_TypeError, "%s: a contiguous array of %s", what, fmt);
        return -1;
    }
    return 0;
}

/* out[M] = min(out[M], (adv + right[M]) + left[M]) for M in lo..L-1, best[M] = here where
 * it improved (strictly: the first of equal minima stays) */
static void relax(double *restrict out, double *restrict best, const double *restrict right,
                  const double *restrict left, double adv, double here, Py_ssize_t lo,
                  Py_ssize_t L) {
    for (Py_ssize_t M = lo; M < L; M++) {
        double tot = (adv + right[M]) + left[M];
        if (tot < out[M]) {
            out[M] = tot;
            best[M] = here;
        }
    }
}

static PyObject *table(PyObject *self, PyObject *args) {
    PyObject *flops_o, *prefix_o, *bu_o, *cost_o, *arg_o;
    if (!PyArg_ParseTuple(args, "OOOOO", &flops_o, &prefix_o, &bu_o, &cost_o, &arg_o))
        return NULL;
    Py_buffer fl, pf, bv, cv, av;
    if (buffer_of(flops_o, &fl, 8, "d", "flops") < 0) return NULL;
    if (buffer_of(prefix_o, &pf, 8, "d", "prefix") < 0) goto e1;
    if (buffer_of(bu_o, &bv, 8, "lq", "bu") < 0) goto e2;
    if (buffer_of(cost_o, &cv, 8, "d", "cost") < 0) goto e3;
    if (buffer_of(arg_o, &av, 4, "i", "arg") < 0) goto e4;
    Py_ssize_t m = fl.len / 8;
    Py_ssize_t n = m + 1;
    if (pf.len / 8 != n || bv.len / 8 != n || cv.len % (8 * n * n) || av.len / 4 != cv.len / 8) {
        PyErr_SetString(PyExc_ValueError, "table: shapes (m), (m+1), (m+1), (m+1, m+1, K+1)");
        goto e5;
    }
    Py_ssize_t L = cv.len / (8 * n * n);  /* levels + 1 */
    const double *flops = (const double *)fl.buf, *prefix = (const double *)pf.buf;
    const int64_t *bu = (const int64_t *)bv.buf;
    double *cost = (double *)cv.buf;
    int32_t *arg = (int32_t *)av.buf;
    for (Py_ssize_t i = 0; i < n * n * L; i++) {
        cost[i] = INFINITY;
        arg[i] = -1;
    }
    double *best_mid = (double *)malloc(sizeof(double) * L);
    double *col = (double *)malloc(sizeof(double) * L * n);
    if (best_mid == NULL || col == NULL) {
        free(best_mid);
    free(col);
        free(col);
        PyErr_NoMemory();
        goto e5;
    }
#define AT(s, e) ((((s) * n) + (e)) * L)
    for (Py_ssize_t s = 0; s < m; s++)
        for (Py_ssize_t M = 0; M < L; M++) cost[AT(s, s + 1) + M] = flops[s];
    Py_BEGIN_ALLOW_THREADS
    /* e ascending, s descending: (mid, e) and (s, mid) are done before (s, e); the column
     * cost[., e] being filled is kept contiguous in `col` (the table is too big for cache) */
    for (Py_ssize_t e = 1; e <= m; e++) {
        memcpy(col + (e - 1) * L, cost + AT(e - 1, e), sizeof(double) * L);
        for (Py_ssize_t s = e - 2; s >= 0; s--) {
            double *out = col + s * L;
            for (Py_ssize_t M = 0; M < L; M++) {
                out[M] = INFINITY;
                best_mid[M] = (double)(s + 1);
            }
            int64_t peak = 0;
            for (Py_ssize_t mid = s + 1; mid < e; mid++) {
                int64_t pair = bu[mid] + (mid > s + 1 ? bu[mid - 1] : 0);
                if (pair > peak) peak = pair;
                if (peak >= L) break;  /* the peak only grows: no later mid fits */
                if (bu[mid] >= L) continue;
                int64_t lo = peak > bu[mid] ? peak : bu[mid];
                double adv = prefix[mid] - prefix[s];
                relax(out, best_mid, col + mid * L - bu[mid], cost + AT(s, mid), adv,
                      (double)mid, lo, L);
            }
            memcpy(cost + AT(s, e), out, sizeof(double) * L);
            int32_t *out_arg = arg + AT(s, e);
            for (Py_ssize_t M = 0; M < L; M++) out_arg[M] = (int32_t)best_mid[M];
        }
    }
    Py_END_ALLOW_THREADS
#undef AT
    free(best_mid);
    free(col);
    PyBuffer_Release(&av);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&bv);
    PyBuffer_Release(&pf);
    PyBuffer_Release(&fl);
    Py_RETURN_NONE;
e5:
    PyBuffer_Release(&av);
e4:
    PyBuffer_Release(&cv);
e3:
    PyBuffer_Release(&bv);
e2:
    PyBuffer_Release(&pf);
e1:
    PyBuffer_Release(&fl);
    return NULL;
}

static PyMethodDef methods[] = {
    {"table", table, METH_VARARGS,
     "table(flops, prefix, bu, cost, arg): fill cost (float64, (m+1, m+1, K+1)) and arg "
     "(int32, same shape) in place"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dp",
                                    "The multi-level DP's table, compiled.", -1, methods};

PyMODINIT_FUNC PyInit__dp(void) { return PyModule_Create(&module); }
