/*
 * failure_alarm.c -- alarms between ranks (request.h; docs/design.md, "Failures").
 *
 * An alarm is one fixed-size message: u64 step, i32 rank, i32 code, then the
 * message text (NUL-terminated, cut to fit). A data alarm goes out at most once
 * an epoch from each rank, to every other rank; the receivers look for alarms
 * while their waits sleep (hvdl_alarm_poll, from the engine's watch hook). At
 * the next round the ranks that sent one say so in their header, and every rank
 * settles: it receives what it is still owed, so that no alarm outlives its
 * epoch. Engine alarms are not settled: after one the engine is gone.
 *
 * What is received is checked like anything else from the wire: its size, the
 * code's range and the text's end; the sender is MPI's source, not a field.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request/request.h"

enum { TAG_DATA = 0x4841, TAG_ENGINE = 0x4845 };
#define ALARM_HEAD  16
#define ALARM_BYTES (ALARM_HEAD + HVDL_ERRMSG_LEN)

static void pack(char *out, uint64_t step, int rank, int code, const char *msg) {
  int32_t r = rank, c = code;
  memcpy(out, &step, 8);
  memcpy(out + 8, &r, 4);
  memcpy(out + 12, &c, 4);
  size_t n = strlen(msg);
  if (n > HVDL_ERRMSG_LEN - 1) n = HVDL_ERRMSG_LEN - 1;
  memcpy(out + ALARM_HEAD, msg, n);
  out[ALARM_HEAD + n] = '\0';
}

static void unpack(const char *in, int bytes, int source, struct hvdl_alarm_note *note) {
  int32_t c = hvdlRemoteError;
  note->step = HVDL_NO_STEP - 1; /* a short message fails the current step and every later one */
  note->rank = source;
  note->msg[0] = '\0';
  if (bytes >= ALARM_HEAD) {
    memcpy(&note->step, in, 8);
    memcpy(&c, in + 12, 4);
    size_t n = (size_t)bytes - ALARM_HEAD;
    if (n > HVDL_ERRMSG_LEN - 1) n = HVDL_ERRMSG_LEN - 1;
    memcpy(note->msg, in + ALARM_HEAD, n);
    note->msg[n] = '\0';
  }
  if (c <= hvdlSuccess || c >= hvdlNumResults || c == hvdlInProgress) c = hvdlRemoteError;
  if (!note->msg[0]) snprintf(note->msg, sizeof note->msg, "a malformed alarm (%d bytes)", bytes);
  note->code = c;
}

static void send_all(struct hvdl_alarm *a, const char *out, MPI_Request *reqs, int tag) {
  for (int q = 0; q < a->size; q++) {
    reqs[q] = MPI_REQUEST_NULL;
    if (q != a->rank &&
        MPI_Isend(out, ALARM_BYTES, MPI_BYTE, q, tag, a->comm, &reqs[q]) != MPI_SUCCESS)
      reqs[q] = MPI_REQUEST_NULL; /* the peer is gone: nothing more can be told */
  }
}

hvdlResult_t hvdl_alarm_init(struct hvdl_alarm *a, MPI_Comm comm) {
  memset(a, 0, sizeof *a);
  a->comm = comm;
  MPI_Comm_rank(comm, &a->rank);
  MPI_Comm_size(comm, &a->size);
  a->first.step = HVDL_NO_STEP;
  a->got = calloc((size_t)a->size, 1);
  a->out = malloc(ALARM_BYTES);
  a->engine_out = malloc(ALARM_BYTES);
  a->sreq = malloc(sizeof *a->sreq * (size_t)a->size);
  a->engine_sreq = malloc(sizeof *a->engine_sreq * (size_t)a->size);
  if (!a->got || !a->out || !a->engine_out || !a->sreq || !a->engine_sreq) {
    hvdl_alarm_free(a);
    return hvdl_fail(NULL, hvdlSystemError, "hvd_lite engine: out of memory for its alarms");
  }
  return hvdlSuccess;
}

void hvdl_alarm_free(struct hvdl_alarm *a) {
  /* Sends still pending (a peer that never received) are left to MPI: their
   * buffers are kept, since MPI may still read them. */
  if (!a->sent) free(a->out);
  if (!a->engine_sent) free(a->engine_out);
  if (!a->sent) free(a->sreq);
  if (!a->engine_sent) free(a->engine_sreq);
  free(a->got);
  a->got = NULL;
  a->out = a->engine_out = NULL;
  a->sreq = a->engine_sreq = NULL;
}

void hvdl_alarm_raise(struct hvdl_alarm *a, uint64_t step, int code, const char *msg) {
  if (step < a->first.step) {
    a->first.step = step;
    a->first.rank = a->rank;
    a->first.code = code;
    snprintf(a->first.msg, sizeof a->first.msg, "%s", msg);
  }
  if (a->sent) return;
  pack(a->out, step, a->rank, code, msg);
  send_all(a, a->out, a->sreq, TAG_DATA);
  a->sent = 1;
}

void hvdl_alarm_raise_engine(struct hvdl_alarm *a, int code, const char *msg) {
  if (a->engine_sent || a->engine_down) return; /* a remote engine alarm is not repeated */
  pack(a->engine_out, HVDL_NO_STEP, a->rank, code, msg);
  send_all(a, a->engine_out, a->engine_sreq, TAG_ENGINE);
  a->engine_sent = 1;
}

/* Receives one alarm of `tag` from `source` (MPI_ANY_SOURCE: whichever is there). */
static void receive(struct hvdl_alarm *a, int source, int tag) {
  char in[ALARM_BYTES];
  MPI_Status st;
  int bytes = 0;
  if (MPI_Recv(in, ALARM_BYTES, MPI_BYTE, source, tag, a->comm, &st) != MPI_SUCCESS) return;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  struct hvdl_alarm_note note;
  unpack(in, bytes, st.MPI_SOURCE, &note);
  if (tag == TAG_ENGINE) {
    if (!a->engine_down) a->engine = note;
    a->engine_down = 1;
    return;
  }
  a->got[st.MPI_SOURCE] = 1;
  if (note.step < a->first.step) a->first = note;
}

int hvdl_alarm_poll(struct hvdl_alarm *a) {
  int any = 0;
  for (int tag = TAG_DATA;; tag = tag == TAG_DATA ? TAG_ENGINE : TAG_DATA) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, a->comm, &flag, &st) != MPI_SUCCESS) return any;
    if (flag) {
      receive(a, st.MPI_SOURCE, tag);
      any = 1;
    } else if (tag == TAG_ENGINE) {
      return any;
    }
  }
}

hvdlResult_t hvdl_alarm_settle(struct hvdl_alarm *a, const unsigned char *alarmed) {
  for (int q = 0; q < a->size; q++)
    if (q != a->rank && alarmed[q] && !a->got[q])
      receive(a, q, TAG_DATA); /* sent before this round */
  if (a->sent)
    MPI_Waitall(a->size, a->sreq, MPI_STATUSES_IGNORE); /* the others receive theirs now */
  a->sent = 0;
  memset(a->got, 0, (size_t)a->size);
  a->first.step = HVDL_NO_STEP;
  a->epoch++;
  return hvdlSuccess;
}
