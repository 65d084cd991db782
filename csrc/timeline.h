/*
 * timeline.h -- Chrome-trace events written by rank 0 (timeline.c); every call
 * is a no-op when tl is NULL. Called by the engine and the executor.
 */
#ifndef HVDL_TIMELINE_H_
#define HVDL_TIMELINE_H_

struct hvdl_timeline;

struct hvdl_timeline *hvdl_timeline_open(const char *path);
void hvdl_timeline_event(struct hvdl_timeline *tl, const char *tensor, const char *phase,
                         double t_begin, double t_end);
void hvdl_timeline_flush(struct hvdl_timeline *tl);
void hvdl_timeline_close(struct hvdl_timeline *tl);

#endif /* HVDL_TIMELINE_H_ */
