import Foundation

/// How an added task runs, beyond its tag and payload: what
/// ``TaskQueue/add(tag:payload:dataId:groupId:options:)-(String,_,_,_,_)`` takes as `options`.
///
/// The default (`[]`) is a task that runs as soon as a runner may take it, at normal priority,
/// added even when a twin is queued. Name only what differs:
///
/// ```swift
/// try await queue.add(tag: "save-note", payload: note, groupId: note.id)
/// try await queue.add(tag: "upload", payload: photo, options: [.manual, .priority(.high)])
/// try await queue.add(tag: "sync", payload: Inbox(), dataId: "inbox", options: [.unique(.keep)])
/// ```
///
/// Each element sets one option, in order: when two set the same one, the last wins, as
/// assigning the property twice would. Options worked out at run time read better through
/// ``init(manual:unique:priority:deadline:schedule:)`` or the properties.
public struct TaskOptions: Sendable, Equatable, ExpressibleByArrayLiteral {
  /// Whether the task runs only when a pass asks for it by id (``RunFilter/task(_:)``), never otherwise.
  public var manual: Bool
  /// What the add does when a twin (same tag and `dataId`) is queued; needs a `dataId` unless
  /// ``UniquePolicy/append``.
  public var unique: UniquePolicy
  /// Among the tasks that may start, a pass claims the more urgent first. It never reorders a
  /// group: a group's tasks run in id order, and its head competes with its own priority.
  public var priority: TaskPriority
  /// No run of the task starts after it; nil for none.
  public var deadline: Date?
  /// When the first run may start, and whether the task repeats.
  public var schedule: TaskSchedule

  /// The default options, the same as `[]`.
  public init() { self.init(manual: false) }

  /// Options spelled out; each defaults to what `[]` means.
  public init(
    manual: Bool = false, unique: UniquePolicy = .append, priority: TaskPriority = .normal,
    deadline: Date? = nil, schedule: TaskSchedule = .now
  ) {
    self.manual = manual
    self.unique = unique
    self.priority = priority
    self.deadline = deadline
    self.schedule = schedule
  }

  /// The options these elements set, applied in order (the last of two that set the same wins).
  public init(_ elements: some Sequence<TaskOption>) {
    self.init()
    for element in elements { element.apply(to: &self) }
  }

  /// The options these elements set, applied in order (the last of two that set the same wins).
  public init(arrayLiteral elements: TaskOption...) {
    self.init(elements)
  }
}

/// One of the ``TaskOptions`` of an add, written as an element of its array literal.
public struct TaskOption: Sendable, Equatable {
  enum Setting: Sendable, Equatable {
    case manual
    case unique(UniquePolicy)
    case priority(TaskPriority)
    case deadline(Date)
    case schedule(TaskSchedule)
  }

  let setting: Setting

  /// The task runs only when a pass asks for it by id (``RunFilter/task(_:)``), never otherwise.
  public static let manual = TaskOption(setting: .manual)

  /// What the add does when a task of the same tag and `dataId` is queued (``UniquePolicy``).
  public static func unique(_ policy: UniquePolicy) -> TaskOption { TaskOption(setting: .unique(policy)) }

  /// How urgent the task is among those that may start (``TaskOptions/priority``).
  public static func priority(_ priority: TaskPriority) -> TaskOption {
    TaskOption(setting: .priority(priority))
  }

  /// No run of the task starts after `date`, on the store's clock (``TaskOptions/deadline``).
  public static func deadline(_ date: Date) -> TaskOption { TaskOption(setting: .deadline(date)) }

  /// When the first run may start, and whether it repeats (``TaskSchedule``).
  public static func schedule(_ schedule: TaskSchedule) -> TaskOption {
    TaskOption(setting: .schedule(schedule))
  }

  func apply(to options: inout TaskOptions) {
    switch setting {
    case .manual: options.manual = true
    case .unique(let policy): options.unique = policy
    case .priority(let priority): options.priority = priority
    case .deadline(let date): options.deadline = date
    case .schedule(let schedule): options.schedule = schedule
    }
  }
}
