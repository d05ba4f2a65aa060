// One thread running the tasks pushed to it, in order: an offloaded optimizer's copies of its
// updated pieces to the device, beside the host's AdamW of the next ones (StepRunner::step).
//
//   LinkQueue q;
//   q.push([&] { copy(i); });  // runs on q's thread
//   q.drain();                 // returns when every task pushed so far has run
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tessera {

struct LinkQueue {
  LinkQueue() : worker_([this] { run(); }) {}
  ~LinkQueue() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> l(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Returns when every task pushed so far has run.
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    done_.wait(l, [this] { return tasks_.empty() && !busy_; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      l.unlock();
      task();
      l.lock();
      busy_ = false;
      done_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false, stop_ = false;
  std::thread worker_;  // last: started once the rest is made
};

}  // namespace tessera
