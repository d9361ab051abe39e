/* Metrics registry rendered in the Prometheus text exposition format 0.0.4.
 *
 * A family (counter, gauge or histogram) is registered once with a name, help
 * text and fixed label names; label values are given at update time and a
 * series is created the first time a combination is seen. Registration
 * validates the name (must start with "rlorch_", match
 * [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in "_total", unique in the registry)
 * and label names ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"); on error it
 * returns NULL with a message, it never aborts.
 *
 * Label values are passed as an array with exactly as many entries as label
 * names (NULL when the family has no labels); values may hold any bytes of
 * UTF-8 and are escaped on output.
 *
 * Thread-safety: none. Updates and rendering happen on the daemon's loop
 * thread only; other threads hand their observations to the loop first.
 * Handles stay valid until metrics_registry_free. */
#ifndef RLORCH_METRICS_H
#define RLORCH_METRICS_H

#include <stddef.h>

typedef struct metrics_registry metrics_registry;
typedef struct metrics_family metrics_counter;
typedef struct metrics_family metrics_gauge;
typedef struct metrics_family metrics_histogram;

/* Most series one family may hold; further label combinations get -ENOSPC so
 * a bug that puts ids into labels cannot eat the memory. The per-worker
 * families hold one series per worker name the table holds, live and lost:
 * up to twice WORKERS_MAX (workers.c asserts it). */
#define METRICS_MAX_SERIES 32768

metrics_registry *metrics_registry_new(void);
void metrics_registry_free(metrics_registry *r);

/* label_names: NULL-terminated array, or NULL for none. */
metrics_counter *metrics_counter_new(metrics_registry *r, const char *name, const char *help,
                                     const char *const *label_names, char *err, size_t errlen);
metrics_gauge *metrics_gauge_new(metrics_registry *r, const char *name, const char *help,
                                 const char *const *label_names, char *err, size_t errlen);
/* buckets: upper bounds, finite and strictly increasing; +Inf is implicit. */
metrics_histogram *metrics_histogram_new(metrics_registry *r, const char *name, const char *help,
                                         const char *const *label_names, const double *buckets,
                                         size_t nbuckets, char *err, size_t errlen);

/* Updates return 0, -EINVAL (NULL family, negative or NaN counter increment),
 * -ENOMEM or -ENOSPC (too many series). */
int metrics_counter_add(metrics_counter *c, const char *const *label_values, double v);
int metrics_counter_inc(metrics_counter *c, const char *const *label_values);
/* Sets a counter that mirrors one its source counts itself (a worker's own
 * totals): the value only grows while the source lives; a lower value is the
 * source starting again, which Prometheus' rate() takes as a reset. */
int metrics_counter_set(metrics_counter *c, const char *const *label_values, double v);
int metrics_gauge_set(metrics_gauge *g, const char *const *label_values, double v);
int metrics_gauge_add(metrics_gauge *g, const char *const *label_values, double v);
int metrics_histogram_observe(metrics_histogram *h, const char *const *label_values, double v);
/* Drops the series of these label values from a family of any kind (what a
 * worker that is gone no longer needs): 0, or -ENOENT when there is none. */
int metrics_series_remove(struct metrics_family *f, const char *const *label_values);

/* Renders every family: # HELP, # TYPE, then the series. *buf is malloc'd and
 * NUL-terminated (*len excludes the NUL); the caller frees it. 0 or -ENOMEM. */
int metrics_render(metrics_registry *r, char **buf, size_t *len);

/* Prometheus spelling of a sample value: "NaN", "+Inf", "-Inf" or the
 * shortest decimal that reads back to v. Returns the length written. */
int metrics_format_value(double v, char *out, size_t outlen);

#endif
