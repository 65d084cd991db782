/*
 * timeline.c -- Chrome-trace JSON (chrome://tracing, ui.perfetto.dev) written by
 * rank 0's engine: one row per tensor, one complete ("X") event per phase.
 *
 * The file is valid JSON at every moment, even if the job is killed: it always
 * ends with "\n]\n", and each new event is written with one pwrite() over that
 * ending (",\n{event}\n]\n"), so a file cut between two writes still parses.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "request/request.h"

struct hvdl_timeline {
  int fd;
  off_t end; /* offset of the closing "\n]\n" */
  int events;
  double t0;
  char **names; /* tensor name -> row (tid) */
  int nnames, cap;
};

struct hvdl_timeline *hvdl_timeline_open(const char *path) {
  struct hvdl_timeline *tl = calloc(1, sizeof *tl);
  if (!tl) return NULL;
  tl->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (tl->fd < 0) {
    free(tl);
    return NULL;
  }
  static const char head[] =
      "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, "
      "\"args\": {\"name\": \"hvd_lite rank 0\"}}\n]\n";
  if (pwrite(tl->fd, head, sizeof head - 1, 0) != (ssize_t)(sizeof head - 1)) {
    close(tl->fd);
    free(tl);
    return NULL;
  }
  tl->end = (off_t)(sizeof head - 1) - 3;
  tl->t0 = hvdl_now();
  return tl;
}

static void append(struct hvdl_timeline *tl, const char *json) {
  size_t n = strlen(json);
  char *text = malloc(n + 8);
  if (!text) return;
  memcpy(text, ",\n", 2);
  memcpy(text + 2, json, n);
  memcpy(text + 2 + n, "\n]\n", 3);
  if (pwrite(tl->fd, text, n + 5, tl->end) == (ssize_t)(n + 5)) tl->end += (off_t)(n + 2);
  free(text);
}

static int row_of(struct hvdl_timeline *tl, const char *tensor) {
  for (int i = 0; i < tl->nnames; i++)
    if (strcmp(tl->names[i], tensor) == 0) return i + 1;
  if (tl->nnames == tl->cap) {
    int cap = tl->cap ? tl->cap * 2 : 64;
    char **p = realloc(tl->names, sizeof *p * (size_t)cap);
    if (!p) return 0;
    tl->names = p;
    tl->cap = cap;
  }
  tl->names[tl->nnames] = strdup(tensor);
  int row = ++tl->nnames;
  char json[HVDL_MAX_NAME + 128];
  snprintf(
      json, sizeof json,
      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"",
      row);
  size_t k = strlen(json);
  for (const char *c = tensor; *c && k + 8 < sizeof json; c++) /* JSON-escape the name */
    k += (size_t)snprintf(
        json + k, sizeof json - k,
        (*c == '"' || *c == '\\') ? "\\%c" : ((unsigned char)*c < 0x20 ? "?" : "%c"), *c);
  snprintf(json + k, sizeof json - k, "\"}}");
  append(tl, json);
  return row;
}

void hvdl_timeline_event(struct hvdl_timeline *tl, const char *tensor, const char *phase,
                         double t_begin, double t_end) {
  if (!tl) return;
  int row = row_of(tl, tensor);
  char json[256];
  snprintf(
      json, sizeof json,
      "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
      phase, row, (t_begin - tl->t0) * 1e6, (t_end - t_begin) * 1e6);
  append(tl, json);
}

void hvdl_timeline_flush(struct hvdl_timeline *tl) {
  if (tl) fsync(tl->fd);
}

void hvdl_timeline_close(struct hvdl_timeline *tl) {
  if (!tl) return;
  close(tl->fd);
  for (int i = 0; i < tl->nnames; i++) free(tl->names[i]);
  free(tl->names);
  free(tl);
}
